"""The verdict a step's counts support (what is counted, and how: trainserve.rollout.measure).

Each check bounds one quantity with anytime-valid bounds at --gate-alpha (trainserve.stats.sequential), which
hold over every look of the step however many there are (a step that holds, a rollout paused and resumed):

    error_ratio    the candidate's error share on its canary requests minus stable's on its own, same step, within
                   points or a share of stable's share, the larger (trainserve.rollout.error_budget)
    slow_calls     the share of the candidate's calls above stable's p99 minus stable's share above it
    flip_rate      the share of classified shadow pairs whose top class differs, against a budget anchored to
                   the two versions' offline disagreement (the START record's `offline`)
    shadow_errors  the candidate's failed shadow copies minus stable's error share on its requests, same step: a
                   copy is a second call to the same server and meets its transient errors (UNAVAILABLE,
                   DEADLINE_EXCEEDED) as often as stable's calls do
    slow_copies    the share of the shadow copies the candidate answered above stable's p99 minus stable's share
                   above it, same step: a guard that fails a slow candidate at the shadow step, never holds one

A check fails when its bounds show the quantity above its budget, passes when they show it within, and otherwise
knows nothing yet: the step holds at its end. None passes on fewer than --gate-min-requests of its units, nor fails
unless the failure is certain whatever the rest of that minimum shows (a canary rejecting every request fails
after its first few).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from trainserve.rollout.error_budget import error_budget
from trainserve.rollout.plan import CANARY, SHADOW, Step
from trainserve.rollout.rollout_config import StepGate
from trainserve.stats.proportions import wilson_upper
from trainserve.stats.sequential import confidence_sequence, difference_sequence

PASS, FAIL, UNKNOWN = "pass", "fail", "unknown"
ADVANCE, ROLLBACK, HOLD, WATCH = "advance", "rollback", "hold", "watch"
# Shadow copies by outcome: the first three were sent and answered or failed; the rest never judged the candidate.
ANSWERED = ("shadow_compared", "shadow_incomparable", "shadow_errors")
UNSENT = ("shadow_dropped", "shadow_shed")
OFFERED = (*ANSWERED, *UNSENT, "shadow_cut")
# The candidate's share of a comparison's alpha: its bounds, on a canary share of the requests, are the wide ones;
# stable's, on the rest, widen little at a fifth of alpha.
CANARY_ALPHA = 0.8


@dataclass(frozen=True)
class Check:
    name: str
    result: str  # PASS, FAIL, UNKNOWN
    said: str
    # The numbers `said` words, for a check whose bounds were judged (None otherwise, and in older histories): the
    # quantity's bounds, its budget, and how many of its units they rest on (the decision report plots them).
    low: float | None = None
    high: float | None = None
    budget: float | None = None
    seen: float | None = None
    unit: str | None = None


def check_names(step: Step, flips: bool) -> list[str]:
    """The checks that apply to `step`, by name (`flips`: a classifier's shadow pairs are being compared); what
    `checks` judges and the dry run prints."""
    names = {SHADOW: ["shadow_errors", "slow_copies"], CANARY: ["error_ratio", "slow_calls"]}.get(step.kind, [])
    return [*names, "flip_rate"] if flips else names


def checks(step: Step, flips: bool, counts: dict[str, int], gate: StepGate, offline: dict) -> list[Check]:
    """The checks that apply to `step`, on the step's `counts` (measure's contract). Each passes, fails or knows
    nothing yet; `decide` weighs them by whether the step's time is up. `offline`: what the candidate's offline
    evidence said (the START record's `offline`)."""
    return [_CHECKS[name](counts, gate, offline) for name in check_names(step, flips)]


def reaches(step: Step, flips: bool, counts: dict[str, int], gate: StepGate, offline: dict, decision: str) -> bool:
    """Whether `decide(checks(...), ended=True)` would be `decision` (ADVANCE or ROLLBACK), judging the checks one
    at a time and stopping at the first that settles it: what a simulation of many looks asks."""
    for name in check_names(step, flips):
        result = _CHECKS[name](counts, gate, offline).result
        if decision == ADVANCE and result != PASS:
            return False
        if decision == ROLLBACK and result == FAIL:
            return True
    return decision == ADVANCE


def decide(found: list[Check], ended: bool) -> str:
    if any(c.result == FAIL for c in found):
        return ROLLBACK
    if not ended:
        return WATCH
    return ADVANCE if all(c.result == PASS for c in found) else HOLD


Bounds = Callable[[int], tuple[float, float]]  # a quantity's bounds with n units seen


def _one(events: int, alpha: float) -> Bounds:
    return lambda n: confidence_sequence(events, n, alpha)


def _against(events: int, other: tuple[int, int], alpha: float) -> Bounds:
    """The difference from `other` (events, n) of `events` among n."""
    return lambda n: difference_sequence((events, n), other, alpha, CANARY_ALPHA)


def _judge(name: str, what: str, seen: tuple[int, str], budget: float, bounds: Bounds, gate: StepGate) -> Check:
    """The verdict of `bounds(n)` (the quantity's bounds with `n` units seen, the events as counted) against
    `budget`. Below --gate-min-requests units, a failure only if the bounds, with the rest of that minimum added as
    units without an event (the most favourable rest), would still fail."""
    n, unit = seen
    low, high = bounds(n)
    said = f"{what}; anytime {1 - gate.alpha:g} bounds [{low:+.4f}, {high:+.4f}] vs max {budget:+.4f}"
    numbers = {"low": low, "high": high, "budget": budget, "seen": n, "unit": unit}
    if n < gate.min_requests:
        if bounds(gate.min_requests)[0] > budget:
            return Check(
                name, FAIL, f"{said}: beyond it whatever the rest of --gate-min-requests {unit} show", **numbers
            )
        return Check(
            name, UNKNOWN, f"{said}: {n} {unit}, fewer than --gate-min-requests {gate.min_requests}", **numbers
        )
    if low > budget:
        return Check(name, FAIL, f"{said}: shown beyond it", **numbers)
    if high <= budget:
        return Check(name, PASS, f"{said}: shown within it", **numbers)
    return Check(name, UNKNOWN, f"{said}: not shown within it nor beyond it yet", **numbers)


def _share(events: float, n: int) -> str:
    count = f"{events:.1f}" if events != int(events) else f"{int(events)}"  # slow calls are weighted
    return f"{count}/{n} = {events / n:.4f}" if n else f"{count}/0"


def _errors(counts: dict, gate: StepGate, offline: dict) -> Check:
    """Both versions' error shares over the same step, from the same proxy counters: an outage that hits both
    alike moves both alike."""
    errors, requests = counts["canary_errors"], counts["canary_requests"]
    stable = (counts["stable_errors"], counts["stable_requests"])
    budget = error_budget(errors, stable, gate, CANARY_ALPHA)
    what = f"error share {_share(errors, requests)} on the canary vs stable's {_share(*stable)}{budget.said}"
    return _judge("error_ratio", what, (requests, "canary requests"), budget.budget, budget.bounds, gate)


def _slow(counts: dict, gate: StepGate, offline: dict) -> Check:
    """The shares of each version's calls above stable's p99 (interpolated in its bucket as histogram_quantile()
    does; the calls in that bucket weighted: trainserve.rollout.measure): counts, not two interpolated quantiles."""
    slow, timed = counts["candidate_slow"], counts["candidate_latency_count"]
    stable = (counts["stable_slow"], counts["stable_latency_count"])
    what = f"calls above stable's p99 {_share(slow, timed)} vs stable's {_share(*stable)}"
    bounds = _against(slow, stable, gate.alpha)
    return _judge("slow_calls", what, (timed, "candidate calls timed"), gate.max_slow_increase, bounds, gate)


def _shadow_errors(counts: dict, gate: StepGate, offline: dict) -> Check:
    """The candidate's failures among the shadow copies it was sent, against stable's error share over the same
    step. A copy exists only for a request stable answered, but it is a second call to the same server: it meets
    the server's transient errors as stable's calls do, so an identical candidate fails about stable's share."""
    errors, answered = counts["shadow_errors"], sum(counts[k] for k in ANSWERED)
    stable = (counts["stable_errors"], counts["stable_requests"])
    budget = error_budget(errors, stable, gate, CANARY_ALPHA)
    what = f"failed shadow copies {_share(errors, answered)} vs stable's error share {_share(*stable)}{budget.said}"
    return _judge("shadow_errors", what, (answered, "copies answered"), budget.budget, budget.bounds, gate)


def _slow_copies(counts: dict, gate: StepGate, offline: dict) -> Check:
    """The shadow copies' latency against stable's calls over the same step, on the same server, counted as
    slow_calls counts the canary's. Pairing on one server holds for a failure only: a copy is sent while the server
    has room (shed otherwise, shadow_headroom) and is timed without the proxy's own work, so it meets a lighter
    load than the clients' calls and a candidate is favoured, never harmed, by it; an identical one is not failed by
    load it did not cause. So the check fails a candidate shown slower by more than --gate-max-slow-increase, and
    otherwise lets the step go on (the canary's slow_calls shows latency within its budget): a candidate whose slow
    copies slow the clients, so that the rest are shed, is rolled back on the copies it answered, not held."""
    slow, timed = counts["copies_slow"], counts["copies_latency_count"]
    stable = (counts["stable_slow"], counts["stable_latency_count"])
    what = f"shadow copies above stable's p99 {_share(slow, timed)} vs stable's calls {_share(*stable)}"
    bounds = _against(slow, stable, gate.alpha)
    found = _judge("slow_copies", what, (timed, "copies timed"), gate.max_slow_increase, bounds, gate)
    if found.result == FAIL:
        return found
    return Check(found.name, PASS, f"{found.said} (only a failure counts here: slow_calls judges the canary)")


def flip_budget(offline: dict, gate: StepGate) -> tuple[float, str] | None:
    """The online flip rate's budget and why: the larger of --gate-flip-budget-multiple times the offline
    disagreement and that disagreement's one-sided Wilson bound at --gate-alpha (a small offline sample cannot
    make the budget small), at least --gate-flip-budget-floor. None without an offline disagreement."""
    found = offline.get("disagreement")
    if not found or not found["examples"]:
        return None
    count, examples = found["count"], found["examples"]
    rate, upper = count / examples, wilson_upper(count, examples, gate.alpha)
    budget = max(gate.flip_budget_floor, gate.flip_budget_multiple * rate, upper)
    said = (
        f"budget {budget:.4f} = max(floor {gate.flip_budget_floor:g}, {gate.flip_budget_multiple:g} x {rate:.4f}, "
        f"bound {upper:.4f}) from {found['source']}'s disagreement {count}/{examples}"
    )
    return budget, said


def _flips(counts: dict, gate: StepGate, offline: dict) -> Check:
    name = "flip_rate"
    flips, classified, pairs = counts["shadow_flips"], counts["shadow_classified"], counts["shadow_pairs"]
    if not classified:
        return Check(name, UNKNOWN, f"no classification output compared ({pairs} pairs compared on other outputs)")
    budget = flip_budget(offline, gate)
    if budget is None:
        return Check(name, UNKNOWN, "no offline disagreement of the two versions (START record) to anchor a budget")
    what = f"flips {_share(flips, classified)} of classified pairs ({budget[1]})"
    offered, unsent = sum(counts[k] for k in OFFERED), sum(counts[k] for k in UNSENT)
    if unsent > gate.max_shadow_dropped * offered:
        return _flips_with_unsent(counts, gate, budget[0], what, (unsent, offered))
    return _judge(name, what, (classified, "classified pairs"), budget[0], _one(flips, gate.alpha), gate)


def _flips_with_unsent(counts: dict, gate: StepGate, budget: float, what: str, unsent: tuple[int, int]) -> Check:
    """With more copies dropped or shed than --gate-max-shadow-dropped, the flips of the rest may not stand for the
    traffic, but a failure still is certain when the unsent copies, counted as the most favourable outcome (pairs
    without a flip, as many a copy as the compared copies had), leave the bound beyond the budget: a candidate
    flipping 72 % of the answers compared is rolled back whatever was shed. Limit: the pairs of an unsent copy are
    taken as the compared copies' mean (the proxy does not parse the copies it sheds)."""
    flips, classified, compared = counts["shadow_flips"], counts["shadow_classified"], counts["shadow_compared"]
    unsent_pairs = math.ceil(unsent[0] * classified / max(compared, 1))
    found = _judge("flip_rate", what, (classified + unsent_pairs, "pairs"), budget, _one(flips, gate.alpha), gate)
    shed = f"{unsent[0]} of {unsent[1]} shadow copies dropped or shed"
    if found.result == FAIL:
        return Check(found.name, FAIL, f"{found.said}, with the {shed} counted as {unsent_pairs} pairs without a flip")
    return Check(
        found.name,
        UNKNOWN,
        f"{what}: {shed}, more than --gate-max-shadow-dropped {gate.max_shadow_dropped:g}: the flips of the rest may "
        "not stand for the traffic",
    )


_CHECKS = {
    "shadow_errors": _shadow_errors,
    "slow_copies": _slow_copies,
    "error_ratio": _errors,
    "slow_calls": _slow,
    "flip_rate": _flips,
}
