"""How often the paired-accuracy non-inferiority gate passes, computed exactly rather than planned: the chance
that the lower end of the gate's own interval (trainserve.stats.proportions.paired_proportion_interval) lies above
-margin, over everything an eval of n examples can draw.

Before an eval neither the number of discordant pairs nor their split is known: the pairs D are Binomial(n, psi)
(psi, the discordance, the share of examples exactly one version gets right) and, of those, the candidate wins
Binomial(D, q), q = (psi - drop) / (2 psi) for a candidate truly `drop` worse (1/2 for equal versions). Fixing D
at round(n psi), as a planning formula does, gets the power wrong: 71-94 % for a promised 80 % at a few dozen
pairs, 18 % where n psi is half a pair (rounded to none); summing over both draws gets it right.

The interval's lower end lies above -m exactly when Tango's score statistic at the difference -m exceeds z and the
exact conditional bound of b / D (Clopper-Pearson) lies above (1 - m n / D) / 2: both are read at -m directly,
with no root to find, so a whole table of (D, b) is judged at once.
"""

from __future__ import annotations

import functools
import math
from statistics import NormalDist

import numpy as np

from trainserve.stats.distributions import two_sided_z, z_quantile
from trainserve.stats.power import ALPHA, POWER

EXACT_PAIRS = 1000  # expected discordant pairs up to which the sum is exact; beyond, the normal formula (within 3 %)
_SPREAD = 8.0  # standard deviations of D covered: what lies beyond weighs less than 1e-14
_SEARCH_STEPS = 18  # bisection halvings of the margin: to 4e-6, below the 4 decimals it is shown with
SHOWN = 10_000  # margins are shown with 4 decimals, and rounded up to them, so the shown number keeps its power


@functools.lru_cache(maxsize=256)  # the pre-flight, the default rule and the report ask for the same numbers
def pass_probability(n: int, margin: float, discordance: float, drop: float = 0.0, alpha: float = ALPHA) -> float:
    """The chance the gate (one-sided `alpha`) passes a candidate truly `drop` worse than the baseline (accuracy
    points as a share; 0: equal versions) on `n` paired examples that disagree on a share `discordance`, with
    `margin`: P(lower end of the interval > -margin). Requires 0 <= drop <= discordance."""
    if n <= 0:
        return 0.0
    if n * discordance > EXACT_PAIRS:  # many pairs: the change is normal, its bound z sqrt(psi / n) below it
        spread = math.sqrt(max(discordance - drop * drop, 1e-300) / n)
        return NormalDist().cdf((margin - drop - two_sided_z(1 - 2 * alpha) * math.sqrt(discordance / n)) / spread)
    pairs = _Pairs(n, discordance, drop)
    return pairs.probability(margin, two_sided_z(1 - 2 * alpha), alpha)


@functools.lru_cache(maxsize=256)
def decidable_margin(n: int, discordance: float, power: float = POWER, alpha: float = ALPHA) -> float:
    """The smallest accuracy margin, rounded up to the 4 decimals it is shown with, that equal versions on `n`
    paired examples with this discordance pass with at least `power`: a margin equal to the number passes
    (the gate's `>` is accounted for). inf with no examples."""
    if n <= 0:
        return math.inf
    psi = min(max(discordance, 0.0), 1.0)
    if n * psi > EXACT_PAIRS:  # many pairs: the normal formula, D's variance included (b - c has n psi)
        return _shown((z_quantile(1 - alpha) + z_quantile(power)) * math.sqrt(psi / n))
    pairs, z = _Pairs(n, psi, 0.0), two_sided_z(1 - 2 * alpha)
    low, high = 0.0, 1.0
    for _ in range(_SEARCH_STEPS):
        middle = (low + high) / 2
        low, high = (low, middle) if pairs.probability(middle, z, alpha) >= power else (middle, high)
    shown = _shown(high)  # the search stops within a shown step: the number is this one or its neighbour below
    below = _shown(shown - 1 / SHOWN)
    return below if below > 0 and pairs.probability(below, z, alpha) >= power else shown


def _shown(margin: float) -> float:
    return math.ceil(round(margin * SHOWN, 6)) / SHOWN


class _Pairs:
    """The joint distribution of (D, b) an eval draws, as a table: rows D, columns b = 0..D. For each D both pass
    conditions hold from some b up (the lower end grows with the candidate's wins), so the chance of passing is
    each row's upper tail of weight from the larger of the two thresholds."""

    def __init__(self, n: int, discordance: float, drop: float):
        psi = min(max(discordance, 0.0), 1.0)
        if not 0 <= drop <= psi:
            raise ValueError(f"drop {drop:g}: expected 0 <= drop <= discordance {psi:g}")
        centre, spread = n * psi, math.sqrt(n * psi * (1 - psi))
        first = max(0, math.floor(centre - _SPREAD * spread))
        last = min(n, math.ceil(centre + _SPREAD * spread + _SPREAD))
        self.n = n
        self.pairs = np.arange(first, last + 1)
        d, b = self.pairs[:, None], np.arange(last + 1)[None, :]
        self.valid = b <= d
        log_factorial = np.array([math.lgamma(k + 1) for k in range(last + 1)])
        self.log_choose = np.where(
            self.valid, log_factorial[d] - log_factorial[b] - log_factorial[np.maximum(d - b, 0)], 0
        )
        weight = _binomial(n, self.pairs, psi)[:, None] * np.exp(self._log_binomial(d, b, _share_won(psi, drop)))
        weight = np.where(self.valid, weight, 0.0)
        tails = np.cumsum(weight[:, ::-1], axis=1)[:, ::-1]  # P(D, B >= b)
        self.tail = np.concatenate([tails, np.zeros((len(self.pairs), 1))], axis=1)  # b = D + 1: nothing passes

    def _log_binomial(self, d: np.ndarray, b: np.ndarray, q: float) -> np.ndarray:
        """log P(b | D) for Binomial(D, q), -inf off its support."""
        with np.errstate(divide="ignore", invalid="ignore"):
            wins = np.where(b > 0, b * math.log(q), 0.0) if q > 0 else np.where(b > 0, -np.inf, 0.0)
            losses = np.where(d > b, (d - b) * math.log(1 - q), 0.0) if q < 1 else np.where(d > b, -np.inf, 0.0)
        return np.where(self.valid, self.log_choose + wins + losses, -np.inf)

    def probability(self, margin: float, z: float, alpha: float) -> float:
        """P(the lower end > -margin) over the table."""
        first_passing = np.maximum(self._tango_threshold(margin, z), self._exact_threshold(margin, alpha))
        return float(np.sum(self.tail[np.arange(len(self.pairs)), first_passing]))

    def _tango_threshold(self, margin: float, z: float) -> np.ndarray:
        """Per D, the fewest wins b with Tango's lower end above -margin: his statistic at -margin beyond z (it
        grows with b), found by bisection on every row at once (D + 1: none)."""
        low, high = np.zeros_like(self.pairs), self.pairs + 1
        while np.any(low < high):
            middle = (low + high) // 2
            passes = _tango_statistic(middle, np.maximum(self.pairs - middle, 0), self.n, -margin) > z
            high, low = np.where(passes, middle, high), np.where(passes, low, np.minimum(middle + 1, high))
        return high

    def _exact_threshold(self, margin: float, alpha: float) -> np.ndarray:
        """Per D, the fewest wins b with the widening to McNemar's exact test above -margin: share (2 p_low - 1)
        > -margin, p_low the Clopper-Pearson lower bound of b / D, holds when P(X >= b | D, p0) < alpha at
        p0 = (1 - margin n / D) / 2 (D + 1: none)."""
        d = self.pairs[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            p0 = np.where(d > 0, (1 - margin * self.n / np.maximum(d, 1)) / 2, -1.0)
        inside = np.clip(p0, 1e-300, 0.5)
        b = np.arange(self.valid.shape[1])[None, :]
        log_pmf = self.log_choose + b * np.log(inside) + np.maximum(d - b, 0) * np.log1p(-inside)
        pmf = np.where(self.valid, np.exp(log_pmf), 0.0)
        upper_tail = np.cumsum(pmf[:, ::-1], axis=1)[:, ::-1]  # P(X >= b)
        passes = self.valid & ((d == 0) | (p0 < 0) | ((b > 0) & ((p0 == 0) | (upper_tail < alpha))))
        return np.where(passes.any(axis=1), passes.argmax(axis=1), self.pairs + 1)


def _tango_statistic(b: np.ndarray, c: np.ndarray, n: int, delta: float) -> np.ndarray:
    """trainserve.stats.proportions.tango_statistic on arrays of counts."""
    quadratic_b = -b - c + (2 * n - b + c) * delta
    quadratic_c = -c * delta * (1 - delta)
    p21 = (np.sqrt(np.maximum(quadratic_b**2 - 8 * n * quadratic_c, 0.0)) - quadratic_b) / (4 * n)
    variance = n * (2 * p21 + delta * (1 - delta))
    numerator = b - c - n * delta
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = numerator / np.sqrt(np.maximum(variance, 0.0))
    return np.where(variance > 0, ratio, np.where(numerator > 0, np.inf, np.where(numerator < 0, -np.inf, 0.0)))


def _share_won(discordance: float, drop: float) -> float:
    """Of the discordant pairs, the share the candidate wins: (psi - drop) / (2 psi); 1/2 with none."""
    return 0.5 if discordance <= 0 else (discordance - drop) / (2 * discordance)


def _binomial(n: int, k: np.ndarray, p: float) -> np.ndarray:
    """Binomial(n, p)'s probabilities at `k`."""
    if p <= 0:
        return (k == 0).astype(float)
    if p >= 1:
        return (k == n).astype(float)
    log_n = math.lgamma(n + 1)
    return np.array(
        [
            math.exp(log_n - math.lgamma(j + 1) - math.lgamma(n - j + 1) + j * math.log(p) + (n - j) * math.log1p(-p))
            for j in k
        ]
    )
