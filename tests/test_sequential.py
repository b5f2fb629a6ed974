"""trainserve.stats.sequential: the mixture martingale against scipy's beta function, the bounds against scipy's
root finder, exact coverage at every n by the binomial's own probabilities, and coverage over all looks at once by
seeded simulations, beside the fixed-level bound that the same looks break."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, special, stats

from trainserve.stats import sequential
from trainserve.stats.proportions import wilson_upper

pytestmark = pytest.mark.unit

ALPHA = 0.05


def scipy_log_martingale(x: int, n: int, p: float) -> float:
    terms = [special.betaln(a + x, b + n - x) - special.betaln(a, b) for a, b in sequential.PRIORS]
    return special.logsumexp(terms) - math.log(len(terms)) - special.xlogy(x, p) - special.xlog1py(n - x, -p)


@pytest.mark.parametrize(("x", "n"), [(0, 1), (0, 500), (3, 300), (30, 300), (299, 300), (360, 6000), (40, 40)])
def test_the_martingale_and_its_bounds_are_scipys(x, n):
    for p in (0.001, 0.01, 0.3, 0.9):
        assert sequential.log_martingale(x, n, p) == pytest.approx(scipy_log_martingale(x, n, p), abs=1e-9)
    low, high = sequential.confidence_sequence(x, n, ALPHA)
    crossing = lambda p: scipy_log_martingale(x, n, p) - math.log(1 / ALPHA)  # noqa: E731
    estimate = x / n
    want_low = 0.0 if x == 0 else optimize.brentq(crossing, 1e-300, estimate, xtol=1e-15)
    want_high = 1.0 if x == n else optimize.brentq(crossing, estimate, 1 - 1e-16, xtol=1e-15)
    assert (low, high) == pytest.approx((want_low, want_high), rel=1e-7, abs=1e-12)
    assert sequential.confidence_sequence(0, 0, ALPHA) == (0.0, 1.0)


@pytest.mark.parametrize("p", [0.005, 0.05, 0.5])
def test_at_each_single_n_the_bounds_miss_at_most_alpha_exactly(p):
    # the binomial's own probabilities, not a simulation: P(p outside the bounds after n) for every n up to 60
    for n in range(1, 61):
        missed = sum(
            stats.binom.pmf(x, n, p)
            for x in range(n + 1)
            if not sequential.confidence_sequence(x, n, ALPHA)[0] <= p <= sequential.confidence_sequence(x, n, ALPHA)[1]
        )
        assert missed <= ALPHA, (n, missed)


LOOKS = np.arange(40, 2001, 40)  # 50 looks
SEQUENCES = 600
TOLERANCE = 3 * math.sqrt(ALPHA * (1 - ALPHA) / SEQUENCES)


@pytest.mark.parametrize("p", [0.01, 0.2])
def test_the_bounds_hold_over_every_look_at_once_where_a_fixed_level_bound_does_not(p):
    rng = np.random.default_rng(int(p * 1000))
    events = np.cumsum(rng.binomial(40, p, (SEQUENCES, LOOKS.size)), axis=1)
    missed = fixed_missed = 0
    for row in events:
        bounds = [sequential.confidence_sequence(int(x), int(n), ALPHA) for x, n in zip(row, LOOKS)]
        missed += any(not low <= p <= high for low, high in bounds)
        fixed_missed += any(wilson_upper(int(x), int(n), ALPHA) < p for x, n in zip(row, LOOKS))
    assert missed / SEQUENCES <= ALPHA + TOLERANCE
    assert fixed_missed / SEQUENCES > 2 * ALPHA  # the simulation has teeth: one fixed-level bound, looked at 50 times


def test_the_difference_holds_over_every_look_however_the_requests_split():
    # 5 % of requests to the first (a canary), the rest to the second; the true difference at the bounds' edge
    rng = np.random.default_rng(7)
    rates, share, looks = (0.03, 0.02), 0.05, np.arange(1000, 30_001, 1000)
    routed = rng.binomial(1000, share, (SEQUENCES, looks.size))
    first_n = np.cumsum(routed, 1)
    first_x = np.cumsum(rng.binomial(routed, rates[0]), 1)
    all_x = first_x + np.cumsum(rng.binomial(1000 - routed, rates[1]), 1)
    missed = 0
    for n1, x1, x in zip(first_n, first_x, all_x):
        bounds = [
            sequential.difference_sequence((int(a), int(b)), (int(c - a), int(d - b)), ALPHA, 0.8)
            for a, b, c, d in zip(x1, n1, x, looks)
        ]
        missed += any(not low <= rates[0] - rates[1] <= high for low, high in bounds)
    assert missed / SEQUENCES <= ALPHA + TOLERANCE


def test_the_bounds_hold_for_a_sum_of_scores_in_0_1():
    # the slow-call check's weighed calls: 1 above the bucket's bound (0.2 %), w = 0.2 in the bucket (4 %), else 0:
    # a mean of 1 %, held over every look by the same sequences as an event's share (sequential's docstring)
    rng = np.random.default_rng(11)
    values, chances = np.array([1.0, 0.2, 0.0]), np.array([0.002, 0.04, 0.958])
    mean = float(values @ chances)
    calls = rng.multinomial(40, chances, (SEQUENCES, LOOKS.size))
    scores = np.cumsum(calls @ values, axis=1)
    missed = sum(
        any(
            not low <= mean <= high
            for low, high in map(sequential.confidence_sequence, row, LOOKS, [ALPHA] * LOOKS.size)
        )
        for row in scores
    )
    assert missed / SEQUENCES <= ALPHA + TOLERANCE
