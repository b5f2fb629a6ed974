"""Confidence sequences of proportions: bounds that hold at every look at once, however often a controller looks
and however long it keeps looking (a step that holds, a paused rollout resumed), so that a check repeated at
every look is one test, not many.

- One proportion (a flip rate, the candidate's errors on shadow copies): Robbins' beta-binomial mixture. For each
  p, M_n(p) = B(a + x, b + n - x) / B(a, b) / (p^x (1 - p)^(n - x)), the likelihood of the x events among n
  under the prior Beta(a, b) over the likelihood under p, is a nonnegative martingale with mean 1 when p is the
  truth; by Ville's inequality it ever reaches 1 / alpha with probability at most alpha. The sequence
  {p : M_n(p) < 1 / alpha} therefore misses the truth at some look with probability at most alpha: each of its
  two ends is a one-sided anytime-valid bound at level alpha (Howard, Ramdas, McAuliffe and Sekhon, "Time-uniform,
  nonparametric, nonasymptotic confidence sequences", Ann. Statist. 2021; Lindon et al., "Rapid regression
  detection in software deployments through sequential testing", KDD 2022, build Netflix's canary tests on
  conjugate mixtures of the same kind). Exact, not asymptotic: it needs no minimum count to hold, and it depends
  on the counts only, so looking at a sum every 30 s is the same as looking at every request.
- Two proportions on different requests (the candidate's errors on its canary route against stable's on its
  own, the share of slow calls of each): each proportion's sequence at a share of alpha, the shares adding to
  alpha, the difference bounded by their ends (low: the first's low minus the second's high). By the union bound
  the difference leaves its bounds at some look with probability at most alpha, whatever the two true rates and
  however the requests split between the routes, so an outage that raises both rates alike moves both alike.
- Scores, not only events: the x among n may be a sum of per-unit scores in [0, 1] (the slow-call check weighs
  the calls in the bucket of stable's p99 by the share of that bucket above it). For each q the factor
  (q / p)^s ((1 - q) / (1 - p))^(1 - s) is convex in s, so its mean over any score in [0, 1] with mean p is at
  most its mean over an event with chance p, which is 1: M_n(p) is then a nonnegative supermartingale, and
  Ville's inequality bounds it as before.

The prior is the even mixture of Jeffreys' Beta(1/2, 1/2) (the Krichevsky-Trofimov mixture, about (1/2) log n
from the best single alternative at any rate) and Beta(1/2, 50), whose mass near 1 % narrows the bounds at the
small rates the checks judge (errors, slow calls, flips); a mixture of martingales is one, so validity holds
whatever the prior, which only moves where the bounds are tightest.
"""

from __future__ import annotations

import math

# Half Jeffreys' Beta(1/2, 1/2), for any rate, half Beta(1/2, 50), for the rates near 1 % the checks judge.
PRIORS = ((0.5, 0.5), (0.5, 50.0))
_NEWTON_STEPS = 100  # Newton's method converges in under 10 from the start below; this only bounds a bad case


def _log_beta(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def log_mixture(events: int, n: int, mirrored: bool = False) -> float:
    """log of the mixture's likelihood of `events` among `n`: the log of the mean over the priors of
    B(a + x, b + n - x) / B(a, b). `mirrored`: each prior Beta(b, a) (the non-events counted as the events)."""
    terms = [
        _log_beta(a + events, b + n - events) - _log_beta(a, b)
        for a, b in ((b, a) if mirrored else (a, b) for a, b in PRIORS)
    ]
    top = max(terms)
    return top + math.log(sum(math.exp(t - top) for t in terms) / len(terms))


def log_martingale(events: int, n: int, p: float, mirrored: bool = False) -> float:
    """log M_n(p): the evidence against the proportion being `p` after `events` among `n` (0 < p < 1)."""
    likelihood = (events * math.log(p) if events else 0.0) + ((n - events) * math.log1p(-p) if n > events else 0.0)
    return log_mixture(events, n, mirrored) - likelihood


def confidence_sequence(events: float, n: int, alpha: float) -> tuple[float, float]:
    """The proportion's bounds after `events` (or scores in [0, 1] summing to it) among `n`: the truth is ever
    below `low` (or ever above `high`), at any look, with probability at most `alpha`. [0, 1] when nothing was
    seen."""
    if n <= 0:
        return (0.0, 1.0)
    return _low(events, n, alpha, False), 1.0 - _low(n - events, n, alpha, True)  # 1 - p's lower end


def _low(events: int, n: int, alpha: float, mirrored: bool) -> float:
    """The lower end: the root below x / n of log M_n(p) = log(1 / alpha), by Newton's method in u = log p, where
    log M is convex and falls towards the root; from the left of the root each step stays left of it."""
    if events == 0:
        return 0.0
    # log M_n(p) - log(1 / alpha) = threshold - log likelihood(p)
    threshold = log_mixture(events, n, mirrored) + math.log(alpha)
    rest = n - events
    if rest == 0:  # the likelihood is p^n: the root in closed form
        return math.exp(threshold / n)
    u = threshold / events  # left of the root: there -x u alone already reaches the threshold
    for _ in range(_NEWTON_STEPS):
        p = math.exp(u)
        gap = threshold - events * u - rest * math.log1p(-p)
        slope = -events + rest * p / (1 - p)
        step = gap / slope
        u -= step
        if abs(step) < 1e-12:
            break
    return math.exp(u)


def difference_sequence(
    first: tuple[int, int], second: tuple[int, int], alpha: float, first_share: float = 0.5
) -> tuple[float, float]:
    """Bounds of p_first - p_second, from (events, n) of each on different requests: the first proportion's
    confidence sequence at `first_share` of `alpha`, the second's at the rest, so the difference leaves them at
    some look with probability at most `alpha`. (A proportion seen on many times the requests of the other gives
    up little width at a smaller share.)"""
    low_1, high_1 = confidence_sequence(*first, alpha * first_share)
    low_2, high_2 = confidence_sequence(*second, alpha * (1 - first_share))
    return low_1 - high_2, high_1 - low_2
