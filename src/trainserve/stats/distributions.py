"""The distributions the intervals and tests are built on, in the standard library only (the eval image has no
scipy; the tests check each against scipy): the normal's quantiles, Student's t, the incomplete beta function,
and the bisection that inverts them."""

from __future__ import annotations

import math
from collections.abc import Callable
from statistics import NormalDist

_NORMAL = NormalDist()
TOLERANCE = 1e-12  # bisection stops here: far below any difference an eval reports


def z_quantile(p: float) -> float:
    """The standard normal's p-quantile."""
    return _NORMAL.inv_cdf(p)


def two_sided_z(level: float) -> float:
    """z with a share (1 - level) / 2 above it: 1.96 for a 95 % interval."""
    return z_quantile(1 - (1 - level) / 2)


def root_of_decreasing(f: Callable[[float], float], low: float, high: float) -> float:
    """The crossing of a decreasing `f` in [low, high] (an end where it does not cross inside)."""
    if f(low) <= 0:
        return low
    if f(high) >= 0:
        return high
    while high - low > TOLERANCE:
        middle = (low + high) / 2
        low, high = (middle, high) if f(middle) > 0 else (low, middle)
    return (low + high) / 2


def t_quantile(p: float, df: float) -> float:
    """Student's t p-quantile with `df` degrees of freedom (the root of its distribution function)."""
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1 - p, df)
    high = 1.0
    while t_cdf(high, df) < p:
        high *= 2
    return root_of_decreasing(lambda t: p - t_cdf(t, df), 0.0, high)


def t_cdf(t: float, df: float) -> float:
    """Student's t distribution function: 1 - I_{df / (df + t^2)}(df / 2, 1 / 2) / 2 for t >= 0."""
    tail = 0.5 * betainc(df / 2, 0.5, df / (df + t * t))
    return 1 - tail if t >= 0 else tail


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), by its continued fraction (Lentz's method)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast on this side only: use the symmetry
        return 1 - betainc(b, a, 1 - x)
    tiny, f, c, d = 1e-300, 1.0, 1.0, 0.0
    for i in range(400):
        m = i // 2
        if i == 0:
            numerator = 1.0
        elif i % 2 == 0:
            numerator = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            numerator = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1 + numerator * d
        d = 1 / (d if abs(d) > tiny else tiny)
        c = 1 + numerator / (c if abs(c) > tiny else tiny)
        f *= c * d
        if abs(1 - c * d) < 1e-15:
            break
    return math.exp(log_front) * (f - 1) / a
