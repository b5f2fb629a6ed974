"""The skew-corrected intervals of live-eval's regression gates (trainserve.stats.skewed_means): equal to Hall's
transformation computed here from the values with scipy (moments, Student's quantiles), Student's interval for
symmetric values, merged sums give the one-sample answer; and at the margin, a seeded simulation of the gate's own
interval counts how often a candidate exactly at the margin passes (nominal one-sided 2.5 %), with a tolerance of
three binomial standard errors of the count. bench/live_eval_gates.py prints the full table."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize
from scipy import stats as scipy_stats

from trainserve.stats.skewed_means import skewed_difference_interval, skewed_mean_interval

pytestmark = pytest.mark.unit
NOMINAL = 0.025  # one-sided: the gate passes when the interval's upper end (of the rise) is below the margin


def sums(values: np.ndarray) -> dict:
    """What a report keeps of `values` (bench/live_eval_gates.py sums alike)."""
    return {"n": len(values), **{k: float(np.sum(values**p)) for p, k in ((1, "sum"), (2, "sum_sq"), (3, "sum_cu"))}}


def hall_reference(centre: float, se: float, lam: float, df: float, level: float = 0.95) -> list[float]:
    """Hall's interval by bisection on g (no closed-form inverse), each end widened to Student's."""
    q = scipy_stats.t.ppf(1 - (1 - level) / 2, df)
    b = lam / 3

    def inverse(x: float) -> float:
        return optimize.brentq(lambda t: t + b * t * t + b * b * t**3 / 3 + b / 2 - x, -1e3, 1e3)

    low, high = centre - se * inverse(q), centre - se * inverse(-q)
    return [min(low, centre - se * q), max(high, centre + se * q)]


def hall_one(values: np.ndarray, level: float = 0.95) -> list[float]:
    n = len(values)
    se = values.std(ddof=1) / math.sqrt(n)
    lam = scipy_stats.skew(values) * (values.std() / values.std(ddof=1)) ** 3 / math.sqrt(n)
    return hall_reference(values.mean(), se, lam, n - 1, level)


def hall_two(a: np.ndarray, b: np.ndarray, level: float = 0.95) -> list[float]:
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se = math.sqrt(va + vb)
    third = scipy_stats.moment(a, 3) / len(a) ** 2 - scipy_stats.moment(b, 3) / len(b) ** 2
    df = se**4 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return hall_reference(a.mean() - b.mean(), se, third / se**3, df, level)


@pytest.mark.parametrize("n", [2, 5, 50, 2000])
def test_equals_halls_transformation_computed_from_the_values(n):
    rng = np.random.default_rng(n)
    values = rng.exponential(2.0, n) ** 2
    said = skewed_mean_interval(*sums(values).values(), 0.95)
    assert said == pytest.approx(hall_one(values), rel=1e-7)
    other = rng.normal(1, 3, 3 * n)
    assert skewed_difference_interval(sums(values), sums(other), 0.95) == pytest.approx(
        hall_two(values, other), rel=1e-7
    )


def test_symmetric_values_give_students_interval_and_merged_sums_the_whole():
    values = np.array([-2.0, -1.0, 0.0, 1.0, 2.0, -0.5, 0.5])
    student = scipy_stats.t.interval(0.9, len(values) - 1, values.mean(), scipy_stats.sem(values))
    assert skewed_mean_interval(*sums(values).values(), 0.9) == pytest.approx(list(student), rel=1e-9)
    halves = [sums(values[:3]), sums(values[3:])]
    merged = {k: sum(h[k] for h in halves) for k in halves[0]}
    assert skewed_mean_interval(*merged.values(), 0.9) == pytest.approx(list(student), rel=1e-9)
    assert skewed_mean_interval(1, 1.0, 1.0, 1.0, 0.95) is None
    assert skewed_mean_interval(3, 3.0, 3.0, 3.0, 0.95) == [1.0, 1.0]


def tolerance(draws: int) -> float:
    return NOMINAL + 3 * math.sqrt(NOMINAL * (1 - NOMINAL) / draws)


def test_a_paired_squared_error_gate_at_the_margin_passes_at_the_nominal_rate():
    """Squared errors of two correlated normal error streams (rho 0.9, the candidate's 1.3 times as spread), 200
    paired examples: Student's interval of the mean difference passed 4.2 % (the old gate); this one holds."""
    draws, n, rho = 3000, 200, 0.9
    rng = np.random.default_rng(7)
    base = rng.standard_normal((draws, n))
    cand = 1.3 * (rho * base + math.sqrt(1 - rho**2) * rng.standard_normal((draws, n)))
    differences = cand**2 - base**2
    margin = 1.3**2 - 1  # the true mean rise: the candidate sits exactly at the margin
    passed = sum(skewed_mean_interval(*sums(d).values(), 0.95)[1] < margin for d in differences)
    assert passed / draws <= tolerance(draws), passed / draws


def test_an_unpaired_absolute_error_gate_of_50_against_1000_passes_at_the_nominal_rate():
    """Absolute errors, 50 of the candidate's against 1,000 of the baseline's (a small canary), the candidate's
    1.5 times as spread and the margin exactly the true rise: Welch's interval passed 3.5 %."""
    draws = 600
    rng = np.random.default_rng(8)
    cand = np.abs(1.5 * rng.standard_normal((draws, 50)))
    base = np.abs(rng.standard_normal((draws, 1000)))
    margin = 0.5 * math.sqrt(2 / math.pi)
    passed = sum(skewed_difference_interval(sums(c), sums(b), 0.95)[1] < margin for c, b in zip(cand, base))
    assert passed / draws <= tolerance(draws), passed / draws
