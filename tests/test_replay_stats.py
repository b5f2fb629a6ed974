"""replay's statistics against independent implementations: the Wilson bound against scipy, its coverage by a
seeded simulation, and the tally's state surviving a report round trip and adding across shards exactly."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from trainserve.evidence.flips import error_gate, error_shares
from trainserve.replay.tally import ReplayTally, histogram_quantile, log_edges
from trainserve.stats.proportions import wilson_upper

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("n", [1, 7, 50, 1000, 250_000])
@pytest.mark.parametrize("alpha", [0.05, 0.01])
def test_wilson_upper_bound_is_scipys(n, alpha):
    for count in sorted({0, 1, n // 3, n - 1, n}):
        expected = stats.binomtest(count, n).proportion_ci(confidence_level=1 - 2 * alpha, method="wilson").high
        assert wilson_upper(count, n, alpha) == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_the_bound_covers_the_true_flip_rate_about_as_often_as_it_says():
    """A gate judged on the bound lets a candidate whose true flip rate is above the max through at most about
    alpha of the time: counted over 4000 seeded replays of 500 examples at a true rate of 2 %."""
    rng = np.random.default_rng(0)
    counts = rng.binomial(500, 0.02, size=4000)
    missed = np.mean([wilson_upper(int(k), 500, 0.05) < 0.02 for k in counts])
    assert missed <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / 4000)


def test_tally_state_round_trips_and_shards_add_exactly():
    rng = np.random.default_rng(1)
    probabilities = rng.dirichlet(np.ones(5), size=(2, 300))
    whole, parts = ReplayTally(5), [ReplayTally(5) for _ in range(3)]
    whole.add_classification(probabilities[0], probabilities[1])
    for i, part in enumerate(parts):
        part.add_classification(probabilities[0][i::3], probabilities[1][i::3])
        part.add_latency("candidate", 0.001 * (i + 1))
    merged = ReplayTally.from_state(parts[0].state())
    for part in parts[1:]:
        merged.merge(ReplayTally.from_state(part.state()))
    np.testing.assert_array_equal(merged.flips, whole.flips)
    np.testing.assert_array_equal(merged.shift, whole.shift)
    assert merged.flip_count() == int(np.sum(probabilities[0].argmax(1) != probabilities[1].argmax(1)))
    assert merged.examples == 300 and merged.latency["candidate"].sum() == 3
    p50 = histogram_quantile(merged.latency["candidate"], log_edges(), 0.5)
    assert 2.0 <= p50 <= 2.0 * 1.02 + 1e-12  # the median latency (2 ms), at most one 2 % bin above


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.floats(0, 1, allow_nan=False), min_size=1, max_size=40))
def test_a_reported_quantile_is_never_above_the_largest_shift_and_never_below_the_exact_one(shifts):
    """The report's shift percentiles are their histogram bin's upper edge, clipped to the largest shift seen (a
    p99 above the max was printed before); each stays at or above the exact quantile."""
    from trainserve.replay.report import shift_summary

    tally = ReplayTally(2)
    candidate = np.array([[0.5 + s / 2, 0.5 - s / 2] for s in shifts])
    tally.add_classification(candidate, np.full_like(candidate, 0.5))
    summary = shift_summary(tally)
    exact = np.abs(candidate - 0.5).max(axis=1)
    for q in (50, 90, 99):
        assert np.quantile(exact, q / 100, method="inverted_cdf") - 1e-12 <= summary[f"p{q}"] <= summary["max"]
    assert summary["max"] == pytest.approx(exact.max())


def test_errors_both_sides_refused_as_invalid_argument_are_no_versions_own():
    tally = ReplayTally(0)
    tally.requests, tally.refused_by_both = 50, 3
    tally.errors["candidate"].update({"INVALID_ARGUMENT": 3, "NOT_FOUND": 1})
    tally.errors["baseline"].update({"INVALID_ARGUMENT": 3})
    shares = error_shares(ReplayTally.from_state(tally.state()).state())
    assert (shares.own("candidate"), shares.own("baseline")) == (1, 0)
    assert error_gate(shares, 0.02)["passed"] and not error_gate(shares, 0.01)["passed"]
