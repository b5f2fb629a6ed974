"""Intervals of proportions (accuracies: right or wrong per example), in the standard library only (the eval
image has no scipy; the tests check each against scipy).

- A single version's proportion (accuracy): Wilson's score interval, never zero-width (at 0 of n or n of n it
  still has the width those n examples leave open).
- A rate that must stay low (replay's flip rate): Wilson's one-sided upper bound, at 1 - alpha (95 % by
  default: one-sided 5 %).
- Two versions' accuracies on the same examples: the difference of paired proportions. Tango's score interval
  (the set of differences the score test does not reject, the nuisance discordant share fitted under each), made
  to contain every difference McNemar's exact test, conditional on the discordant pairs, cannot reject. So the
  interval excludes 0 exactly when McNemar's exact test rejects at the same level: the interval and the test
  never disagree, and with no discordant pair the interval still has Tango's width, not [0, 0].
- Two versions' accuracies on different examples (live traffic each version answered alone): Newcombe's hybrid
  score interval, from the two Wilson intervals.
"""

from __future__ import annotations

import functools
import math

from trainserve.stats.distributions import betainc, root_of_decreasing, two_sided_z, z_quantile


def wilson_interval(successes: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson's score interval of a proportion `successes` of `n` ([0, 1] when n is 0: nothing was seen)."""
    if n <= 0:
        return (0.0, 1.0)
    centre, half = _wilson_centre_and_half(successes, n, two_sided_z(level))
    low = 0.0 if successes <= 0 else max(0.0, centre - half)
    return low, 1.0 if successes >= n else min(1.0, centre + half)


def wilson_upper(count: int, n: int, alpha: float) -> float:
    """One-sided (1 - alpha) upper confidence bound of a proportion: the Wilson score bound, which keeps its
    coverage near the nominal level for small counts, where the normal (Wald) bound collapses to 0 at 0 flips."""
    if n == 0:
        return 1.0
    centre, half = _wilson_centre_and_half(count, n, z_quantile(1 - alpha))
    return min(1.0, centre + half)


def _wilson_centre_and_half(successes: int, n: int, z: float) -> tuple[float, float]:
    """The centre and half-width of Wilson's score interval at normal quantile `z` (n > 0)."""
    p, denominator = successes / n, 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    return centre, z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator


def tango_statistic(candidate_only: int, baseline_only: int, n: int, delta: float) -> float:
    """Tango's score statistic of the paired difference `delta` (candidate's accuracy minus the baseline's):
    (b - c - n delta) over its standard error with the discordant shares fitted under `delta` (their restricted
    maximum likelihood, the root of Tango's quadratic). At delta = 0 it is McNemar's score statistic."""
    b, c = candidate_only, baseline_only
    if delta == 0 and b + c == 0:
        return 0.0
    a, bq, cq = 2 * n, -b - c + (2 * n - b + c) * delta, -c * delta * (1 - delta)
    p21 = (math.sqrt(max(bq * bq - 4 * a * cq, 0.0)) - bq) / (2 * a)
    variance = n * (2 * p21 + delta * (1 - delta))
    numerator = b - c - n * delta
    if variance <= 0:
        return math.copysign(math.inf, numerator) if numerator else 0.0
    return numerator / math.sqrt(variance)


def tango_interval(candidate_only: int, baseline_only: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Every difference of paired proportions Tango's score test does not reject at 1 - level (two-sided)."""
    if n <= 0:
        return (-1.0, 1.0)
    z, estimate = two_sided_z(level), (candidate_only - baseline_only) / n
    low = root_of_decreasing(lambda d: tango_statistic(candidate_only, baseline_only, n, d) - z, -1.0, estimate)
    high = root_of_decreasing(lambda d: tango_statistic(candidate_only, baseline_only, n, d) + z, estimate, 1.0)
    return low, high


def clopper_pearson(successes: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval of a binomial proportion: each tail at (1 - level) / 2."""
    if n <= 0:
        return (0.0, 1.0)
    tail = (1 - level) / 2
    # P(X >= k | p) = I_p(k, n - k + 1) grows with p; P(X <= k | p) = 1 - I_p(k + 1, n - k) falls with p.
    low = (
        0.0
        if successes == 0
        else root_of_decreasing(lambda p: tail - betainc(successes, n - successes + 1, p), 0.0, 1.0)
    )
    high = (
        1.0
        if successes == n
        else root_of_decreasing(lambda p: 1 - betainc(successes + 1, n - successes, p) - tail, 0.0, 1.0)
    )
    return low, high


@functools.lru_cache(maxsize=4096)  # slices and simulations ask for the same counts again
def paired_proportion_interval(
    candidate_only: int, baseline_only: int, n: int, level: float = 0.95
) -> tuple[float, float]:
    """Interval of accuracy(candidate) - accuracy(baseline) on the same `n` examples: Tango's score interval
    widened to hold every difference McNemar's exact test, given the b + c discordant pairs, does not reject
    (the Clopper-Pearson interval of the share b / (b + c), times the discordant share). It excludes 0 exactly
    when McNemar's exact test rejects at 1 - level."""
    low, high = tango_interval(candidate_only, baseline_only, n, level)
    discordant = candidate_only + baseline_only
    if discordant:
        p_low, p_high = clopper_pearson(candidate_only, discordant, level)
        share = discordant / n
        low, high = min(low, share * (2 * p_low - 1)), max(high, share * (2 * p_high - 1))
    return low, high


def single_version_intervals(metrics: dict, n: int, level: float = 0.95) -> dict:
    """Each accuracy of one version's report with Wilson's interval over its `n` examples."""
    return {
        name: {
            "value": metrics[name],
            "interval": list(wilson_interval(round(metrics[name] * n), n, level)),
            "method": "Wilson score interval",
            "level": level,
        }
        for name in ("accuracy", "top_k_accuracy")
        if name in metrics
    }


def newcombe_interval(correct_a: int, n_a: int, correct_b: int, n_b: int, level: float = 0.95) -> tuple[float, float]:
    """Newcombe's hybrid score interval (his method 10) of p_a - p_b, two independent proportions."""
    p_a, p_b = correct_a / n_a, correct_b / n_b
    low_a, high_a = wilson_interval(correct_a, n_a, level)
    low_b, high_b = wilson_interval(correct_b, n_b, level)
    d = p_a - p_b
    return d - math.hypot(p_a - low_a, high_b - p_b), d + math.hypot(high_a - p_a, p_b - low_b)
