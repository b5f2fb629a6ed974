"""Intervals of means (losses, squared or absolute errors: a number per example), in numpy and the standard
library only (the eval image has no scipy; the tests check each against scipy's and a seeded simulation).

- Student's t interval of a mean: exact for normal values, the classic choice for losses.
- The bootstrap-t (studentized bootstrap) interval of a mean: resample the examples, studentize each resample's
  mean by its own standard error, and read the interval's ends from those t values instead of from Student's
  table. Its ends follow skew (second-order accurate), where Student's interval puts too little of its error on
  the long side.
- The interval eval gates a mean difference on: the union of both, each end the farther of the two. Squared
  errors fail each in turn: on skewed ones Student's t lets a candidate exactly at the margin through a one-sided
  2.5 % gate 4-9 % of the time where the bootstrap-t holds 2.5-5 %; on heavy symmetric tails the bootstrap-t's
  own estimate of the tail is noisy (3-7 %) where Student's t stays at 1-4 %. The union keeps the better of the
  two in each; where both fail (an error whose variance is infinite, or scales that vary by orders of magnitude
  between examples) no interval of a mean holds at these sizes, so eval's margin gate also checks the tail
  (trainserve.stats.tails) and passes no bound the tail cannot support; docs/evidence.md states the table
  (bench/mean_intervals.py).
- A paired percentile bootstrap for a statistic that is no plain mean (RMSE, the root of one): resample the
  examples (the same ones for both versions), recompute each version's statistic, take the percentiles.
- From additive sums (n, sum, sum of squares) alone, so windows and merged shards stay exact: Student's t
  interval of a mean, and Welch's interval of the difference of two independent means.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from trainserve.stats.distributions import t_cdf, t_quantile

RESAMPLES, CHUNK = 2000, 250
_CHUNK_VALUES = 2_000_000  # resampled values held at once (16 MB of float64), whatever the number of examples


def _rows_per_chunk(n: int) -> int:
    """Resamples drawn together: CHUNK for small data, fewer for large, so memory stays bounded."""
    return max(1, min(CHUNK, _CHUNK_VALUES // max(n, 1)))


def mean_interval(values: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Student's t interval of the mean of `values` (paired differences); everything when fewer than 2."""
    v = np.asarray(values, np.float64)
    if v.size < 2:
        return (-math.inf, math.inf)
    half = t_quantile(1 - (1 - level) / 2, v.size - 1) * float(v.std(ddof=1)) / math.sqrt(v.size)
    return float(v.mean()) - half, float(v.mean()) + half


def bootstrap_t_interval(
    values: np.ndarray, level: float = 0.95, resamples: int = RESAMPLES, seed: int = 0
) -> tuple[float, float]:
    """The studentized bootstrap interval of the mean of `values` (each tail (1 - level) / 2): mean - q_high * se
    to mean - q_low * se, with q the quantiles of (resample mean - mean) / resample se. Everything when fewer than
    2 values; a point when all are equal (no resample varies)."""
    drawn = _studentized(values, resamples, seed)
    if drawn is None:
        return (-math.inf, math.inf)
    centre, se, studentized = drawn
    if se == 0:
        return centre, centre
    tail = (1 - level) / 2 * 100
    q_low, q_high = np.percentile(studentized, [tail, 100 - tail])
    return centre - float(q_high) * se, centre - float(q_low) * se


def mean_difference_interval(
    values: np.ndarray, level: float = 0.95, resamples: int = RESAMPLES, seed: int = 0
) -> tuple[float, float]:
    """The interval of a mean difference eval gates on: each end the farther of Student's t interval's and the
    bootstrap-t's (their union; see above for why)."""
    student, studentized = mean_interval(values, level), bootstrap_t_interval(values, level, resamples, seed)
    return min(student[0], studentized[0]), max(student[1], studentized[1])


def mean_difference_p_value(values: np.ndarray, resamples: int = RESAMPLES, seed: int = 0) -> float:
    """The two-sided p-value of a mean of 0 that agrees with mean_difference_interval about 0 at every level: the
    larger of Student's and the bootstrap-t's (the union excludes 0 only where both intervals do)."""
    return max(t_test_p_value(values), bootstrap_t_p_value(values, resamples, seed))


def t_test_p_value(values: np.ndarray) -> float:
    """Student's two-sided p-value of a mean of 0: below 1 - level exactly when mean_interval(values, level)
    excludes 0. 1 with fewer than 2 values."""
    v = np.asarray(values, np.float64)
    if v.size < 2:
        return 1.0
    se = float(v.std(ddof=1)) / math.sqrt(v.size)
    if se == 0:
        return 1.0 if v.mean() == 0 else 0.0
    return min(1.0, 2 * (1 - t_cdf(abs(float(v.mean())) / se, v.size - 1)))


def bootstrap_t_p_value(values: np.ndarray, resamples: int = RESAMPLES, seed: int = 0) -> float:
    """The two-sided p-value of a mean of 0 from the same studentized resamples: below 1 - level exactly when
    bootstrap_t_interval(values, level) (same resamples and seed) excludes 0, at every level, because it reads
    the observed t's place among the resampled ones with the interpolation np.percentile uses. 1 with fewer
    than 2 values."""
    drawn = _studentized(values, resamples, seed)
    if drawn is None:
        return 1.0
    centre, se, studentized = drawn
    if se == 0:
        return 1.0 if centre == 0 else 0.0
    below = float(np.interp(centre / se, np.sort(studentized), np.linspace(0.0, 1.0, studentized.size)))
    return min(1.0, 2 * min(below, 1 - below))


def _studentized(values: np.ndarray, resamples: int, seed: int) -> tuple[float, float, np.ndarray] | None:
    """The mean, its standard error and the resamples' t values (None for fewer than 2 values; no t values when
    the standard error is 0)."""
    v = np.asarray(values, np.float64)
    if v.size < 2:
        return None
    centre, se = float(v.mean()), float(v.std(ddof=1)) / math.sqrt(v.size)
    if se == 0:
        return centre, se, np.empty(0)
    rng, chunk = np.random.default_rng(seed), _rows_per_chunk(v.size)
    studentized = []
    for start in range(0, resamples, chunk):
        sample = v[rng.integers(0, v.size, (min(chunk, resamples - start), v.size))]
        spread = sample.std(axis=1, ddof=1) / math.sqrt(v.size)
        with np.errstate(divide="ignore", invalid="ignore"):
            t = (sample.mean(axis=1) - centre) / spread
        studentized.append(t[spread > 0])  # a resample of one repeated value says nothing about the spread
    return centre, se, np.concatenate(studentized)


def mean(values: np.ndarray) -> np.ndarray:
    """Per resample (rows): the mean over examples."""
    return values.mean(axis=-1)


def root_mean(values: np.ndarray) -> np.ndarray:
    """Per resample: the square root of the mean (RMSE from squared errors)."""
    return np.sqrt(values.mean(axis=-1))


def bootstrap_interval(
    a: np.ndarray,
    b: np.ndarray,
    statistic: Callable[[np.ndarray], np.ndarray] = mean,
    resamples: int = RESAMPLES,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile interval of statistic(a) - statistic(b) over paired resamples of the examples (rows of a and b
    are the same examples)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if not a.size:
        return (0.0, 0.0)
    rng, chunk = np.random.default_rng(seed), _rows_per_chunk(len(a))
    differences = []
    for start in range(0, resamples, chunk):
        rows = rng.integers(0, len(a), (min(chunk, resamples - start), len(a)))
        differences.append(statistic(a[rows]) - statistic(b[rows]))
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(np.concatenate(differences), [tail, 100 - tail])
    return float(low), float(high)


def mean_and_variance(n: int, total: float, total_sq: float) -> tuple[float, float]:
    """The mean and the sample variance (ddof 1; 0 for fewer than 2) of n values from their two sums."""
    centre = total / n
    return centre, max(total_sq - n * centre * centre, 0.0) / (n - 1) if n > 1 else 0.0


def mean_interval_from_sums(n: int, total: float, total_sq: float, level: float) -> list[float] | None:
    """Student's t interval of a mean, as mean_interval computes it from the values; None for fewer than 2."""
    if n < 2:
        return None
    centre, variance = mean_and_variance(n, total, total_sq)
    half = t_quantile(1 - (1 - level) / 2, n - 1) * math.sqrt(variance / n)
    return [centre - half, centre + half]


def welch_interval(a: dict, b: dict, level: float) -> tuple[float, float] | tuple[None, None]:
    """Welch's interval of mean(a) - mean(b), two independent samples given as {n, sum, sum_sq}."""
    if a["n"] < 2 or b["n"] < 2:
        return None, None
    (mean_a, var_a), (mean_b, var_b) = (mean_and_variance(s["n"], s["sum"], s["sum_sq"]) for s in (a, b))
    share_a, share_b = var_a / a["n"], var_b / b["n"]
    se = math.sqrt(share_a + share_b)
    if se == 0:
        return mean_a - mean_b, mean_a - mean_b
    df = se**4 / (share_a**2 / (a["n"] - 1) + share_b**2 / (b["n"] - 1))
    half = t_quantile(1 - (1 - level) / 2, df) * se
    return mean_a - mean_b - half, mean_a - mean_b + half
