"""The error checks' budget relative to stable's error share (trainserve.rollout.error_budget): an outage failing
both versions alike is decided within a step at 10 requests/s, a candidate at the relative budget is rolled back at
most alpha of the time however often it is looked at, one adding 10 points to the outage is rolled back, and every
verdict holds for each share of stable's that its bounds allow (an independent check on a grid)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainserve.rollout.analysis import CANARY_ALPHA, FAIL, PASS, checks
from trainserve.rollout.error_budget import error_budget
from trainserve.rollout.measure import KEYS
from trainserve.rollout.plan import CANARY, Step
from trainserve.rollout.rollout_config import StepGate
from trainserve.stats.sequential import confidence_sequence

pytestmark = pytest.mark.unit

GATE = StepGate()
STEP = Step(CANARY, 50, 3 * 3600)
OUTAGE = 0.30
ROLLOUTS = 150
TOLERANCE = 3 * math.sqrt(GATE.alpha * (1 - GATE.alpha) / ROLLOUTS)


def error_check(canary: tuple[int, int], stable: tuple[int, int], gate: StepGate = GATE):
    counts = dict.fromkeys(KEYS, 0) | {
        "canary_errors": canary[0],
        "canary_requests": canary[1],
        "stable_errors": stable[0],
        "stable_requests": stable[1],
    }
    return next(c for c in checks(STEP, False, counts, gate, {}) if c.name == "error_ratio")


def looks(rng, rates: tuple[float, float], per_look: int = 300, count: int = 360):
    """A 50 % canary step's (canary, stable) counts at each look, `per_look` requests between looks (10 requests/s
    looked at every 30 s for 3 hours), errors at `rates` (canary, stable)."""
    canary = np.cumsum(rng.binomial(per_look, STEP.percent / 100, count))
    stable = per_look * np.arange(1, count + 1) - canary
    canary_errors = np.cumsum(rng.binomial(np.diff(canary, prepend=0), rates[0]))
    stable_errors = np.cumsum(rng.binomial(np.diff(stable, prepend=0), rates[1]))
    for c, s, ce, se in zip(canary, stable, canary_errors, stable_errors):
        yield (int(ce), int(c)), (int(se), int(s))


def first_verdict(rng, rates: tuple[float, float], gate: StepGate = GATE, count: int = 360) -> tuple[str, int]:
    """The first of `count` looks' results that is not `unknown`, and the canary requests it rests on."""
    for canary, stable in looks(rng, rates, count=count):
        found = error_check(canary, stable, gate).result
        if found != "unknown":
            return found, canary[1]
    return "unknown", canary[1]


def test_an_outage_on_both_versions_is_passed_within_a_step_where_a_budget_in_points_cannot_decide():
    rng = np.random.default_rng(0)
    relative = [first_verdict(rng, (OUTAGE, OUTAGE)) for _ in range(40)]
    points = [first_verdict(rng, (OUTAGE, OUTAGE), replace(GATE, max_relative_error_increase=0.0)) for _ in range(40)]
    assert sum(result == PASS for result, _ in relative) >= 38
    assert np.median([n for _, n in relative]) < 36_000  # canary requests: 10 requests/s at 50 % for 2 hours
    assert all(result == "unknown" for result, _ in points)


def test_a_candidate_adding_ten_points_to_an_outage_is_rolled_back_within_its_step():
    rng = np.random.default_rng(1)
    found = [first_verdict(rng, (OUTAGE + 0.10, OUTAGE)) for _ in range(40)]
    assert all(result == FAIL for result, _ in found)


def test_a_candidate_at_the_relative_budget_is_rarely_rolled_back_however_often_looked_at():
    rng = np.random.default_rng(2)
    at_budget = (OUTAGE * (1 + GATE.max_relative_error_increase), OUTAGE)
    failed = [first_verdict(rng, at_budget, count=100)[0] == FAIL for _ in range(ROLLOUTS)]
    assert np.mean(failed) <= GATE.alpha + TOLERANCE


@settings(max_examples=200, deadline=None)
@given(
    canary=st.integers(1, 3_000).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))),
    stable=st.integers(1, 30_000).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))),
)
def test_each_verdict_holds_for_every_share_of_stables_its_bounds_allow(canary, stable):
    found = error_budget(canary[0], stable, GATE, CANARY_ALPHA)
    low, high = found.bounds(canary[1])
    verdict = PASS if high <= found.budget else FAIL if low > found.budget else "unknown"
    own_low, own_high = confidence_sequence(*canary, GATE.alpha * CANARY_ALPHA)
    shares = np.linspace(*confidence_sequence(*stable, GATE.alpha * (1 - CANARY_ALPHA)), 201)
    budgets = np.maximum(GATE.max_error_increase, GATE.max_relative_error_increase * shares)
    if verdict == PASS:  # within the budget whatever stable's share and the candidate's within their bounds
        assert np.all(own_high - shares <= budgets + 1e-12)
    if verdict == FAIL:
        assert np.all(own_low - shares > budgets - 1e-12)
