"""How often a regression gate passes a candidate exactly at its margin: the one-sided error of each interval of a
mean paired difference of squared errors (nominal 2.5 %: the upper end of a two-sided 95 % interval below the
true change), in seeded simulations of the shapes squared errors take.

The candidate's errors are the baseline's plus an extra error, so its MSE is worse by exactly E[extra^2] (the
margin); each eval draws n examples. Scenarios: the docs' skewed one (Laplace extra error), heavier tails
(Student's t with 3 and 5 degrees of freedom, a log-normal baseline error), and heteroscedastic errors (each
example's error scale log-normal, sigma 0.5 and 1, the candidate's extra error in proportion to it), and two
versions with independent errors, the candidate's wider (heavy symmetric tails, where Student's t is
conservative).

Intervals: Student's t (trainserve.stats.means.mean_interval), the bootstrap-t
(trainserve.stats.means.bootstrap_t_interval) and their union (trainserve.stats.means.mean_difference_interval),
and what eval gates on now: the union, with no pass where the tail check (trainserve.stats.tails) finds the
differences' tail too heavy for the standard error. Beside each cell's error at the margin, in the same runs, what
a gate is for: how often it passes an equal version (the candidate's errors drawn again as the baseline's, so the
true change is 0): a gate that never passes holds its rate as surely as one that never fails. --write puts both
tables into docs/evidence.md.

    python bench/mean_intervals.py [--runs 1000] [--resamples 1000] [--sizes 50,100,200,500] [--write]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from promote_defaults import DOC, write  # noqa: E402

from trainserve.stats import means, tails  # noqa: E402

SCENARIOS = {
    "skewed (docs): Laplace extra error": lambda rng, n: (rng.normal(0, 1, n), rng.laplace(0, 1, n), 2.0),
    "heavy: t3 extra error": lambda rng, n: (rng.normal(0, 1, n), rng.standard_t(3, n), 3.0),
    "heavy: t5 extra error": lambda rng, n: (rng.normal(0, 1, n), rng.standard_t(5, n), 5 / 3),
    "heavy: log-normal baseline, Laplace extra": lambda rng, n: (rng.lognormal(0, 1, n), rng.laplace(0, 1, n), 2.0),
    "heteroscedastic, scale sigma 0.5": lambda rng, n: _scaled(rng, n, 0.5),
    "heteroscedastic, scale sigma 1": lambda rng, n: _scaled(rng, n, 1.0),
    "independent t6 errors, candidate 1.1x wider": lambda rng, n: _independent(rng, n, 6, 1.1),
    "independent t4.5 errors, candidate 1.2x wider": lambda rng, n: _independent(rng, n, 4.5, 1.2),
}


def _scaled(rng, n: int, sigma: float):
    """Each example's errors scaled by its own log-normal factor s: E[extra^2] = E[s^2] = exp(2 sigma^2)."""
    scale = rng.lognormal(0, sigma, n)
    return scale * rng.normal(0, 1, n), scale * rng.normal(0, 1, n), math.exp(2 * sigma * sigma)


def _independent(rng, n: int, df: float, wider: float):
    """Two versions' errors drawn apart (Student's t, `df`), the candidate's `wider`, as (baseline error, candidate
    minus baseline error, the true MSE change (w^2 - 1) df / (df - 2))."""
    candidate, baseline = rng.standard_t(df, n) * wider, rng.standard_t(df, n)
    return baseline, candidate - baseline, (wider * wider - 1) * df / (df - 2)


def upper_ends(d: np.ndarray, resamples: int, seed: int) -> dict[str, float]:
    """Each interval's upper end; the union's with the tail check is infinite where the check holds a pass back."""
    student, studentized = means.mean_interval(d, 0.95)[1], means.bootstrap_t_interval(d, 0.95, resamples, seed)[1]
    union = max(student, studentized)
    checked = union if tails.tail_check([tails.side_from_values(d)])["enough"] else math.inf
    return {
        "Student's t": student,
        "bootstrap-t": studentized,
        "union (eval's before)": union,
        "union and tail check (eval's)": checked,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--sizes", default="50,100,200,500")
    parser.add_argument("--write", action="store_true", help="write the table into docs/evidence.md")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    started = time.perf_counter()
    rows = []
    for name, draw in SCENARIOS.items():
        for n in sizes:
            rng = np.random.default_rng(7)
            at_margin: dict[str, int] = {}
            equal: dict[str, int] = {}
            for run in range(args.runs):
                base, extra, margin = draw(rng, n)
                again, extra_again, _ = draw(rng, n)
                _count(at_margin, (base + extra) ** 2 - base**2, margin, args.resamples, run)
                _count(equal, (base + extra) ** 2 - (again + extra_again) ** 2, margin, args.resamples, run)
            rows.append(
                (
                    name,
                    n,
                    {m: v / args.runs for m, v in at_margin.items()},
                    {m: v / args.runs for m, v in equal.items()},
                )
            )
    noise = 100 * 1.96 * math.sqrt(0.025 * 0.975 / args.runs)
    safety = _table(rows, 2, f"at the margin ({args.runs} evals a cell, {args.resamples} resamples)")
    liveness = _table(rows, 3, "an equal version")
    table = f"Passed at the margin (nominal 2.5 %, +-{noise:.1f} points by chance):\n\n{safety}\n\n"
    table += f"Passed, an equal version at the same margin:\n\n{liveness}"
    print(table)
    print(f"({time.perf_counter() - started:.0f} s)")
    if args.write:
        write(DOC, "mean-intervals", table)


def _count(passed: dict[str, int], d: np.ndarray, margin: float, resamples: int, seed: int) -> None:
    for method, upper in upper_ends(d, resamples, seed).items():
        passed[method] = passed.get(method, 0) + int(upper < margin)


def _table(rows: list, column: int, what: str) -> str:
    methods = list(rows[0][column])
    lines = [f"| scenario, {what} | n | " + " | ".join(methods) + " |", "|" + "---|" * (len(methods) + 2)]
    for row in rows:
        rates = row[column]
        lines.append(f"| {row[0]} | {row[1]} | " + " | ".join(f"{100 * rates[m]:.1f} %" for m in methods) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
