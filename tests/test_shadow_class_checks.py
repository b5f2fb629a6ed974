"""The shadow's verdicts for every model (issue 55): a candidate flipping 30 % of one class and 1 % overall is rolled
back at the shadow step, an identical one advances, and the per-class check's family-wise error over the classes
and the looks stays within alpha (seeded); a regression candidate whose error doubled is rolled back, an identical
one passes; the regression anchor read from a replay's |difference| bins (trainserve.rollout.shadow_checks)."""

from __future__ import annotations

import numpy as np
import pytest
from reports import regression_replay_report

from trainserve.evidence.flips import replay_failures
from trainserve.replay.tally import LOG_BINS, ReplayTally, log_edges
from trainserve.rollout.analysis import ADVANCE, FAIL, PASS, ROLLBACK, UNKNOWN, check_names, checks, decide
from trainserve.rollout.measure import KEYS
from trainserve.rollout.offline import difference_anchor, upper_edge
from trainserve.rollout.plan import SHADOW, Step
from trainserve.rollout.rollout_config import StepGate
from trainserve.rollout.shadow_checks import CLASS_FAMILY, flip_classes

pytestmark = pytest.mark.unit

GATE = StepGate()
OFFLINE = {"disagreement": {"source": "eval", "count": 200, "examples": 10_000, "candidate": 2, "baseline": 1}}
SHADOW_STEP = Step(SHADOW, 100, 90)
STABLE = {"stable_requests": 20_000, "stable_latency_count": 20_000, "stable_slow": 200}


def counts(pairs: dict[str, int], flips: dict[str, int]) -> dict:
    """A shadow step's counts: classified pairs and flips by stable's class, their totals, copies compared alike."""
    total, flipped = sum(pairs.values()), sum(flips.values())
    seen = dict.fromkeys(KEYS, 0) | STABLE
    seen |= {"shadow_compared": total, "shadow_pairs": total, "shadow_classified": total, "shadow_flips": flipped}
    seen |= {"copies_latency_count": total, "copies_slow": 0.01 * total}
    seen |= {f"shadow_class_pairs:{c}": n for c, n in pairs.items()}
    return seen | {f"shadow_class_flips:{c}": flips.get(c, 0) for c in pairs}


def test_a_candidate_flipping_30_percent_of_one_class_and_1_percent_overall_is_rolled_back():
    # digits-like: class 7 is 3 % of the traffic and flips 30 % of the time; the rest flip 0.1 %: 1 % overall
    pairs = {str(c): 19_400 // 9 for c in range(10) if c != 7} | {"7": 600}
    flips = {str(c): 2 for c in range(10) if c != 7} | {"7": 180}
    found = {c.name: c for c in checks(SHADOW_STEP, True, counts(pairs, flips), GATE, OFFLINE)}
    assert found["flip_rate"].result == PASS  # overall 1 %, budget 4 %: the average hides it
    assert found["flip_classes"].result == FAIL and "class 7: flips 180/600" in found["flip_classes"].said
    assert decide(list(found.values()), ended=False) == ROLLBACK


def test_an_identical_candidate_advances_and_the_class_check_never_holds_it():
    pairs = {str(c): 2_000 for c in range(10)}
    found = checks(SHADOW_STEP, True, counts(pairs, {}), GATE, OFFLINE)
    assert decide(found, ended=True) == ADVANCE
    # a rare class with few pairs and one flip: unknown to its own bound, yet the guard passes (never holds)
    few = checks(SHADOW_STEP, True, counts(pairs | {"9": 3}, {"9": 1}), GATE, OFFLINE)
    assert [c.result for c in few if c.name == "flip_classes"] == [PASS]


def test_the_class_checks_family_wise_rate_over_classes_and_looks_stays_within_alpha():
    """Every class flipping exactly at its budget (the null's hardest case), 17 classes (the proxy's labels) of
    unequal traffic, 12 looks: the share of seeded rollouts in which any class ever fails stays within alpha."""
    rng, rollouts, looks = np.random.default_rng(5), 100, 12
    budget = GATE.flip_class_slack * 0.04  # flip_budget(OFFLINE): 2 x the offline 2 %
    weights = rng.dirichlet(np.ones(CLASS_FAMILY))
    failed = 0
    for _ in range(rollouts):
        pairs, flips = np.zeros(CLASS_FAMILY, int), np.zeros(CLASS_FAMILY, int)
        for _ in range(looks):
            new = rng.multinomial(300, weights)
            pairs, flips = pairs + new, flips + rng.binomial(new, budget)
            seen = counts({str(c): int(n) for c, n in enumerate(pairs)}, {str(c): int(f) for c, f in enumerate(flips)})
            if flip_classes(seen, GATE, OFFLINE).result == FAIL:
                failed += 1
                break
    assert failed / rollouts <= GATE.alpha


def test_the_class_check_returns_pass_or_fail_only_so_a_plan_sized_for_flip_rate_still_fits():
    """What trainserve.rollout.sizing simulates for a good candidate is untouched: the class check never holds."""
    rng = np.random.default_rng(11)
    for _ in range(200):
        pairs = {str(c): int(n) for c, n in enumerate(rng.integers(0, 400, 12))}
        flips = {c: int(rng.binomial(n, rng.uniform(0, 0.5))) for c, n in pairs.items()}
        assert flip_classes(counts(pairs, flips), GATE, OFFLINE).result in (PASS, FAIL)
    assert flip_classes(counts({"0": 500}, {}), GATE, {}).result == UNKNOWN  # no anchor: as flip_rate


def regression(tolerated: int, beyond: int) -> dict:
    seen = dict.fromkeys(KEYS, 0) | STABLE
    seen |= {"shadow_compared": tolerated, "shadow_pairs": tolerated, "shadow_tolerated": tolerated}
    return seen | {"shadow_beyond": beyond, "copies_latency_count": tolerated, "copies_slow": 0.01 * tolerated}


ANCHOR = {"source": "replay", "what": "share beyond the tolerance", "tolerance": 0.8, "count": 40, "examples": 5_000}
ANCHORED = {"difference": {**ANCHOR, "candidate": 2, "baseline": 1}}


def test_a_regression_candidate_with_doubled_error_is_rolled_back_and_an_identical_one_passes():
    assert check_names(SHADOW_STEP, True, ANCHORED) == ["shadow_errors", "slow_copies", "differences"]
    rng = np.random.default_rng(2)
    errors = rng.normal(0, 1.0, 3_000)  # stable's: mean |error| 0.8, the tolerance (1 x stable's MAE)
    # doubled error: the candidate answers truth + 2 x stable's error, so it differs from stable by stable's error
    doubled = regression(3_000, int(np.sum(np.abs(errors) > 0.8)))
    found = checks(SHADOW_STEP, True, doubled, GATE, ANCHORED)
    assert found[-1].result == FAIL and "differs beyond 0.8" in found[-1].said
    assert decide(found, ended=False) == ROLLBACK
    assert decide(checks(SHADOW_STEP, True, regression(3_000, 0), GATE, ANCHORED), ended=True) == ADVANCE


def test_a_proxy_that_counts_no_tolerance_holds_the_regression_check():
    seen = regression(0, 0) | {"shadow_pairs": 3_000, "shadow_compared": 3_000}
    (check,) = [c for c in checks(SHADOW_STEP, True, seen, GATE, ANCHORED) if c.name == "differences"]
    assert check.result == UNKNOWN and "none against the routing file's shadow_tolerance" in check.said


def test_the_regression_anchor_is_stables_mae_times_the_multiple_and_replays_share_beyond_it():
    tally = ReplayTally()
    tally.add_regression(np.array([0.0, 0.1, 0.5, 1.0, 3.0]), np.zeros(5))
    replay = {
        "tally": tally.state(),
        "regression_difference": {},
        "candidate": {"version": 2},
        "baseline": {"version": 1},
    }
    report = {"comparison": {"baseline_metrics": {"mae": 0.4}}}
    found = difference_anchor(report, replay, 2.0)
    assert (found["tolerance"], found["count"], found["examples"]) == (0.8, 2, 5)  # 1.0 and 3.0 beyond 0.8
    assert difference_anchor({}, replay, 2.0) is None
    assert [upper_edge(i) for i in (0, 100, LOG_BINS - 1)] == pytest.approx(
        log_edges()[[1, 101, LOG_BINS]], rel=1e-9
    )  # no baseline's MAE: nothing to scale the tolerance by


def test_a_regression_replay_supports_a_rollout_on_its_error_gate_alone():
    """A regression replay has no flips to gate: it was refused for want of a flip-rate gate, so the differences
    check never had its anchor; its error gate still refuses."""
    differences = np.r_[np.full(40, 1.0), np.full(1960, 0.1)]
    replay = regression_replay_report(2, 1, differences)
    assert replay_failures(replay) == []
    errors = regression_replay_report(2, 1, differences)
    errors["tally"]["errors"]["candidate"] = {"UNAVAILABLE": 100}
    assert [g["kind"] for g in replay["gates"]] == ["max_error_rate"] and replay_failures(errors)


def test_a_class_fails_on_its_own_few_pairs_once_the_step_has_the_minimum_in_all():
    """--gate-min-requests counts every class's pairs: a class of 3 % flipping 30 % fails on its 90 pairs of 3,000
    (it needed 200 of its own, 6,700 in all); before the step has the minimum, only a certain failure counts."""
    pairs = {"0": 90, "other": 2_910}
    found = flip_classes(counts(pairs, {"0": 27, "other": 29}), GATE, OFFLINE)
    assert found.result == FAIL and "class 0: flips 27/90" in found.said
    early = flip_classes(counts({"0": 6, "other": 100}, {"0": 2, "other": 1}), GATE, OFFLINE)
    assert early.result == PASS  # 2 of 6: with the rest of the 200 unflipped, within its budget
