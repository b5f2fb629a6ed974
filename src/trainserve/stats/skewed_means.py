"""Intervals of a mean, and of the difference of two independent means, from additive sums that include the third
power (n, sum, sum of squares, sum of cubes), so windows, slices and merged shards stay exact, corrected for skew.

Student's t (and Welch's) interval assumes the studentized mean is symmetric; for skewed values (squared errors,
their paired differences) it is not: the mean and its standard error move together, and a one-sided 2.5 % gate at
the margin passes 4-10 % of the time at 50 examples. Hall's transformation (Hall 1992, "On the removal of skewness
by transformation", JRSS B 54:221) removes the first-order skew of the studentized statistic T = (mean - mu) / se:
with lam the skewness of the estimate (its third cumulant over se^3; for one mean of n values, the values'
skewness over sqrt n) and b = lam / 3,

    g(T) = T + b T^2 + b^2 T^3 / 3 + b / 2 = ((1 + b T)^3 - 1) / (3 b) + b / 2,

which is monotone and inverted in closed form, is close to symmetric; its quantiles are read from Student's t (n - 1
degrees of freedom, Welch-Satterthwaite's for a difference). Each end is then taken no nearer the mean than
Student's (Welch's): the sample skewness is itself noisy at small n, and the union never passes more often than
either. bench/live_eval_gates.py measures the rates at the margin; the how-to's table states them, and where
heavy tails still exceed the nominal rate.

The third central moment is computed from raw sums, which loses precision when the mean is far larger than the
spread; errors and their differences are of the order of their spread."""

from __future__ import annotations

import functools
import math

from trainserve.stats.distributions import t_quantile


@functools.lru_cache(maxsize=1024)
def _t(p: float, df: float) -> float:
    """Student's quantile, cached: a window's, a slice's and a shard's intervals ask the same few questions."""
    return t_quantile(p, df)


def moments_from_sums(n: int, total: float, total_sq: float, total_cu: float) -> tuple[float, float, float]:
    """(mean, sample variance with ddof 1, third central moment over n) of n values from their three sums."""
    n, total, total_sq, total_cu = int(n), float(total), float(total_sq), float(total_cu)  # numpy scalars: slow
    centre = total / n
    second = max(total_sq / n - centre * centre, 0.0)
    third = total_cu / n - 3 * centre * total_sq / n + 2 * centre**3
    return centre, second * n / (n - 1), third


def hall_ends(centre: float, se: float, lam: float, df: float, level: float) -> list[float]:
    """The interval of a parameter estimated by `centre` (standard error `se`, skewness `lam`), Hall's ends
    widened to Student's where those lie further out."""
    upper_q = _t(1 - (1 - level) / 2, df)
    b = lam / 3
    ends = []
    for q in (upper_q, -upper_q):  # T = upper_q gives the interval's lower end
        if abs(b) < 1e-12:
            t = q - b / 2
        else:
            t = (math.copysign(abs(1 + 3 * b * (q - b / 2)) ** (1 / 3), 1 + 3 * b * (q - b / 2)) - 1) / b
        ends.append(centre - se * t)
    return [min(ends[0], centre - se * upper_q), max(ends[1], centre + se * upper_q)]


def skewed_mean_interval(n: int, total: float, total_sq: float, total_cu: float, level: float) -> list[float] | None:
    """The skew-corrected interval of a mean from its sums; None for fewer than 2 values; a point when all agree."""
    if n < 2:
        return None
    centre, variance, third = moments_from_sums(n, total, total_sq, total_cu)
    se = math.sqrt(variance / n)
    if se == 0:
        return [centre, centre]
    lam = third / (variance**1.5 * math.sqrt(n))
    return hall_ends(centre, se, lam, n - 1, level)


def skewed_difference_interval(a: dict, b: dict, level: float) -> tuple[float, float] | tuple[None, None]:
    """The skew-corrected interval of mean(a) - mean(b), two independent samples given as {n, sum, sum_sq,
    sum_cu}: Welch's standard error and degrees of freedom, the difference's skewness from both third moments."""
    if a["n"] < 2 or b["n"] < 2:
        return None, None
    (mean_a, var_a, third_a), (mean_b, var_b, third_b) = (
        moments_from_sums(s["n"], s["sum"], s["sum_sq"], s["sum_cu"]) for s in (a, b)
    )
    share_a, share_b = var_a / a["n"], var_b / b["n"]
    se = math.sqrt(share_a + share_b)
    if se == 0:
        return mean_a - mean_b, mean_a - mean_b
    df = se**4 / (share_a**2 / (a["n"] - 1) + share_b**2 / (b["n"] - 1))
    lam = (third_a / a["n"] ** 2 - third_b / b["n"] ** 2) / se**3
    low, high = hall_ends(mean_a - mean_b, se, lam, df, level)
    return low, high
