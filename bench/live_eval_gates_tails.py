"""How often live-eval's regression `--max-drop` passes a candidate exactly at the margin where the size of the error
varies with the input: each example's errors (both versions') scaled by its own log-normal factor (sigma 0.5 or 1),
paired on shadowed traffic (n examples both answered, the candidate 1.3 times as spread, correlation 0.9) or
unpaired (n canary labels against the baseline's 1000, the candidate 1.5 times as spread). The margin is the true
rise of the mean squared (absolute) error, computed on a large seeded sample; nominal one-sided 2.5 %.

Before: the skew-corrected interval alone (trainserve.stats.skewed_means, what live-eval gated on). After: the
same interval with the tail check (trainserve.stats.tails: no pass where the standard error rests on fewer than
MIN_DF examples' worth of the tail), what the gate does now; `refused` is the share of evals at the margin whose
bound was inside it but the tail check held the pass back. `equal passes` is the price: how often a candidate
whose true rise is 0 passes the same margin, before and after.

    python bench/live_eval_gates_tails.py [--draws 2000] [--write]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from promote_defaults import write  # noqa: E402

from trainserve.stats.skewed_means import skewed_difference_interval, skewed_mean_interval  # noqa: E402
from trainserve.stats.tails import MIN_DF, side_from_sums, tail_check  # noqa: E402

DOC = Path(__file__).resolve().parents[1] / "docs" / "how-to" / "live-accuracy.md"
METRICS = {"mse": np.square, "mae": np.abs}
SIZES, SIGMAS, BASELINE = (50, 100, 200, 500), (0.0, 0.5, 1.0), 1000  # sigma 0: one scale, the control


def scaled(rng, sigma: float, shape) -> np.ndarray:
    """Errors of unit scale times each example's own log-normal factor."""
    return rng.lognormal(0, sigma, shape) * rng.standard_normal(shape)


def paired(rng, sigma: float, metric: str, shape, rho: float = 0.9, spread: float = 1.3) -> np.ndarray:
    """Per-example differences, candidate minus baseline, of the metric's error (rows: evals)."""
    scale = rng.lognormal(0, sigma, shape)
    base, other = rng.standard_normal(shape), rng.standard_normal(shape)
    candidate = spread * (rho * base + math.sqrt(1 - rho * rho) * other)
    f = METRICS[metric]
    return f(scale * candidate) - f(scale * base)


def unpaired(rng, sigma: float, metric: str, draws: int, n: int, spread: float = 1.5):
    f = METRICS[metric]
    return f(spread * scaled(rng, sigma, (draws, n))), f(scaled(rng, sigma, (draws, BASELINE)))


def row_sums(values: np.ndarray) -> list[dict]:
    """What a report keeps of each row (one eval), summed at once."""
    powers = [values.sum(axis=1), (values**2).sum(axis=1), (values**3).sum(axis=1), (values**4).sum(axis=1)]
    n = values.shape[1]
    return [{"n": n, "sum": a, "sum_sq": b, "sum_cu": c, "sum_qu": d} for a, b, c, d in zip(*powers)]


def side(s: dict):
    return side_from_sums(s["n"], s["sum"], s["sum_sq"], s["sum_cu"], s["sum_qu"])


def judged(upper: float, sides: list, margin: float) -> tuple[bool, bool]:
    """(passed before, passed now): the bound inside the margin, and the tail check met too."""
    inside = upper < margin
    return inside, inside and tail_check(sides)["enough"]


def paired_cell(rng, sigma: float, metric: str, n: int, draws: int, margin: float, shift: float) -> np.ndarray:
    """Per eval: (passed before, passed now), of the paired gate with the true rise at margin - shift."""
    out = []
    for s in row_sums(paired(rng, sigma, metric, (draws, n)) - shift):
        upper = skewed_mean_interval(n, s["sum"], s["sum_sq"], s["sum_cu"], 0.95)[1]
        out.append(judged(upper, [side(s)], margin))
    return np.array(out)


def unpaired_cell(rng, sigma: float, metric: str, n: int, draws: int, margin: float, shift: float) -> np.ndarray:
    candidate, baseline = unpaired(rng, sigma, metric, draws, n)
    out = []
    for c, b in zip(row_sums(candidate - shift), row_sums(baseline)):
        upper = skewed_difference_interval(c, b, 0.95)[1]
        out.append(judged(upper, [side(c), side(b)], margin))
    return np.array(out)


def true_rise(design: str, sigma: float, metric: str) -> float:
    big = np.random.default_rng(98)
    if design == "paired":
        return float(paired(big, sigma, metric, 4_000_000).mean())
    candidate, baseline = unpaired(big, sigma, metric, 1, 4_000_000)
    return float(candidate.mean() - baseline.mean())


def rows(draws: int) -> list[tuple]:
    table = []
    for design, cell in (("paired", paired_cell), ("unpaired", unpaired_cell)):
        for sigma in SIGMAS:
            for metric in METRICS:
                margin = true_rise(design, sigma, metric)
                for n in SIZES:
                    rng = np.random.default_rng(n)
                    at = cell(rng, sigma, metric, n, draws, margin, 0.0).mean(axis=0)
                    equal = cell(rng, sigma, metric, n, draws // 2, margin, margin).mean(axis=0)
                    table.append((design, sigma, metric, n, at, equal))
                    print(_line(table[-1]), flush=True)
    return table


def _line(row) -> str:
    design, sigma, metric, n, at, equal = row
    size = f"{n} both answered" if design == "paired" else f"{n} canary vs {BASELINE}"
    return (
        f"| {design} | {sigma:g} | {metric} | {size} | {100 * at[0]:.1f} % | {100 * at[1]:.1f} % | "
        f"{100 * (at[0] - at[1]):.1f} % | {100 * equal[0]:.0f} % -> {100 * equal[1]:.0f} % |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=2000, help="simulated evals at the margin per cell")
    parser.add_argument("--write", action="store_true", help="write the table into docs/how-to/live-accuracy.md")
    args = parser.parse_args()
    started = time.perf_counter()
    header = [
        f"| design | scale sigma | metric | labelled examples | passes at the margin, before ({args.draws} evals) "
        f"| after (tail check, {MIN_DF} df) | refused | equal versions pass, before -> after |",
        "|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(header), flush=True)
    table = "\n".join(header + [_line(row) for row in rows(args.draws)])
    noise = 100 * 1.96 * math.sqrt(0.025 * 0.975 / args.draws)
    print(f"(nominal 2.5 %, +-{noise:.1f} points by chance; {time.perf_counter() - started:.0f} s)")
    if args.write:
        write(DOC, "live-eval-tails", table)


if __name__ == "__main__":
    main()
