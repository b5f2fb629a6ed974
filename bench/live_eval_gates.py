"""How often live-eval's regression gate (`--max-drop mse=X` / `mae=X`) passes a candidate exactly at the margin:
the nominal rate is one-sided 2.5 % (a 95 % interval whose upper end of the rise must stay below the margin).
Seeded simulation of the gate's own interval functions, from the sums a report keeps: Student's t and Welch's
(what live-eval used) against the skew-corrected intervals (trainserve.stats.skewed_means) it uses now.

Errors: normal, Student's t with 5 degrees of freedom, or Laplace (unit variance); the candidate's 1.3 (paired) or
1.5 (unpaired) times as spread as the baseline's; paired errors correlated (rho); the margin is the true rise of
the mean squared (absolute) error, computed on a large seeded sample.

    python bench/live_eval_gates.py [--draws 4000]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_skewed_means import sums  # noqa: E402

from trainserve.stats.means import mean_interval_from_sums, welch_interval  # noqa: E402
from trainserve.stats.skewed_means import skewed_difference_interval, skewed_mean_interval  # noqa: E402

KINDS = ("normal", "t5", "laplace")
METRICS = {"mse": np.square, "mae": np.abs}


def errors(rng, kind: str, shape) -> np.ndarray:
    if kind == "normal":
        return rng.standard_normal(shape)
    if kind == "t5":
        return rng.standard_t(5, shape) / math.sqrt(5 / 3)
    return rng.laplace(size=shape) / math.sqrt(2)


def paired(rng, kind: str, n: int, draws: int, rho: float, spread: float = 1.3) -> tuple[np.ndarray, np.ndarray]:
    base = errors(rng, kind, (draws, n))
    return base, spread * (rho * base + math.sqrt(1 - rho**2) * errors(rng, kind, (draws, n)))


def paired_rates(rng, kind: str, metric: str, n: int, rho: float, draws: int) -> tuple[float, float]:
    f = METRICS[metric]
    base, cand = paired(np.random.default_rng(99), kind, 1_000_000, 1, rho)
    margin = float(np.mean(f(cand) - f(base)))
    base, cand = paired(rng, kind, n, draws, rho)
    student = skewed = 0
    for d in f(cand) - f(base):
        s = sums(d)
        student += mean_interval_from_sums(n, s["sum"], s["sum_sq"], 0.95)[1] < margin
        skewed += skewed_mean_interval(n, s["sum"], s["sum_sq"], s["sum_cu"], 0.95)[1] < margin
    return student / draws, skewed / draws


def unpaired_rates(rng, kind: str, metric: str, draws: int, spread: float = 1.5) -> tuple[float, float]:
    f = METRICS[metric]
    big = np.random.default_rng(98)
    margin = float(np.mean(f(spread * errors(big, kind, 2_000_000))) - np.mean(f(errors(big, kind, 2_000_000))))
    welch = skewed = 0
    for _ in range(draws):
        cand, base = sums(f(spread * errors(rng, kind, 50))), sums(f(errors(rng, kind, 1000)))
        welch += welch_interval(cand, base, 0.95)[1] < margin
        skewed += skewed_difference_interval(cand, base, 0.95)[1] < margin
    return welch / draws, skewed / draws


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=4000, help="simulated evaluations per cell")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    se = math.sqrt(0.025 * 0.975 / args.draws)
    print(f"pass rate at the margin, nominal 2.5 %; {args.draws} draws a cell (binomial s.e. {100 * se:.2f} points)")
    print(f"{'errors':>8} {'metric':>6} {'design':>22} {'Student/Welch':>14} {'skew-corrected':>15}")
    for kind in KINDS:
        for metric in METRICS:
            for rho in (0.5, 0.9):
                for n in (50, 200, 500):
                    old, new = paired_rates(rng, kind, metric, n, rho, args.draws)
                    design = f"paired n={n} rho={rho}"
                    print(f"{kind:>8} {metric:>6} {design:>22} {100 * old:>13.1f}% {100 * new:>14.1f}%")
            old, new = unpaired_rates(rng, kind, metric, args.draws)
            print(f"{kind:>8} {metric:>6} {'unpaired 50 vs 1000':>22} {100 * old:>13.1f}% {100 * new:>14.1f}%")


if __name__ == "__main__":
    main()
