"""The verdict a step's counts support (what is counted, and how: trainserve.rollout.measure).

The online flip rate's bound is the one-sided Wilson bound of the flips among the shadow pairs
(trainserve.evidence.flips), as replay's gate uses. A check with too few requests knows nothing: the step holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainserve.rollout.config import StepGate
from trainserve.rollout.plan import CANARY, SHADOW, Step
from trainserve.stats.proportions import wilson_upper

PASS, FAIL, UNKNOWN = "pass", "fail", "unknown"
ADVANCE, ROLLBACK, HOLD, WATCH = "advance", "rollback", "hold", "watch"


@dataclass(frozen=True)
class Check:
    name: str
    result: str  # PASS, FAIL, UNKNOWN
    said: str


def check_names(step: Step, flips: bool) -> list[str]:
    """The checks that apply to `step`, by name (`flips`: a classifier's shadow pairs are being compared); what
    `checks` judges and the dry run prints."""
    names = {SHADOW: ["shadow_errors"], CANARY: ["error_ratio", "latency_p99"]}.get(step.kind, [])
    return [*names, "flip_rate"] if flips else names


def checks(step: Step, flips: bool, counts: dict[str, int], values: dict, gate: StepGate, offline: dict) -> list[Check]:
    """The checks that apply to `step`. Each passes, fails or knows nothing yet; `decide` weighs them by whether
    the step's time is up. `offline`: what the candidate's offline evidence said (the START record's `offline`)."""
    return [_CHECKS[name](counts, values, gate) for name in check_names(step, flips)]


def decide(found: list[Check], ended: bool) -> str:
    if any(c.result == FAIL for c in found):
        return ROLLBACK
    if not ended:
        return WATCH
    return ADVANCE if all(c.result == PASS for c in found) else HOLD


def _too_few(name: str, seen: int, gate: StepGate, what: str) -> Check | None:
    if seen >= gate.min_requests:
        return None
    return Check(name, UNKNOWN, f"{seen} {what} this step, fewer than --gate-min-requests {gate.min_requests}")


def _errors(counts: dict, values: dict, gate: StepGate) -> Check:
    """The candidate's server-error ratio on its own canary requests of the step (exact counts: a series born
    during the step is missed by rate() until its second sample), against stable's recording rule."""
    errors, requests = counts["canary_errors"], counts["canary_requests"]
    return _error_increase("error_ratio", "server-error ratio", (errors, requests), "candidate requests", values, gate)


def _error_increase(name: str, what: str, seen: tuple[int, int], unit: str, values: dict, gate: StepGate) -> Check:
    """`seen` (errors, of how many `unit`) as a share, at most --gate-max-error-increase above stable's
    server-error ratio."""
    errors, total = seen
    few = _too_few(name, total, gate, unit)
    if few:
        return few
    stable = values.get("stable_error_ratio")
    if stable is None:
        return Check(name, UNKNOWN, "no server-error ratio of stable yet")
    share = errors / total
    ok = share - stable <= gate.max_error_increase
    said = (
        f"{what} {share:.4f} ({errors} of {total} this step) vs stable's server-error ratio {stable:.4f}: "
        f"increase {share - stable:.4f} {'<=' if ok else '>'} max {gate.max_error_increase:g}"
    )
    return Check(name, PASS if ok else FAIL, said)


def _latency(counts: dict, values: dict, gate: StepGate) -> Check:
    name = "latency_p99"
    few = _too_few(name, counts["canary_requests"], gate, "candidate requests")
    if few:
        return few
    candidate, stable = values.get("candidate_p99_seconds"), values.get("stable_p99_seconds")
    if candidate is None or stable is None:
        return Check(name, UNKNOWN, f"no p99 latency yet (candidate {candidate}, stable {stable})")
    ok = candidate <= gate.max_latency_ratio * stable
    ratio = candidate / stable if stable else float("inf")
    said = (
        f"p99 {candidate:.4f}s vs stable {stable:.4f}s: x{ratio:.2f} {'<=' if ok else '>'} "
        f"max x{gate.max_latency_ratio:g}"
    )
    return Check(name, PASS if ok else FAIL, said)


def _shadow_errors(counts: dict, values: dict, gate: StepGate) -> Check:
    """The candidate's errors on its shadow copies (requests), against stable's server-error ratio."""
    errors, sent = counts["shadow_errors"], counts["shadow_errors"] + counts["shadow_compared"]
    unit = "shadow requests answered"
    return _error_increase("shadow_errors", "shadow error share", (errors, sent), unit, values, gate)


def _flips(counts: dict, values: dict, gate: StepGate) -> Check:
    name = "flip_rate"
    flips, pairs = counts["shadow_flips"], counts["shadow_pairs"]
    few = _too_few(name, pairs, gate, "shadow pairs (examples)")
    upper = wilson_upper(flips, pairs, gate.alpha)
    lower = 1.0 - wilson_upper(pairs - flips, pairs, gate.alpha)
    said = (
        f"flips {flips} of {pairs} pairs, one-sided {1 - gate.alpha:g} bounds [{lower:.4f}, {upper:.4f}] "
        f"vs max {gate.max_flip_rate:g}"
    )
    if pairs and lower > gate.max_flip_rate:  # beyond the budget whatever more pairs would show
        return Check(name, FAIL, said)
    if few:
        return few
    if upper <= gate.max_flip_rate:
        return Check(name, PASS, said)
    # The bounds straddle the budget: not shown small, not shown large. At the step's end that holds the step (more
    # pairs decide it, or --max-hold pauses the rollout); it never advances, and a good candidate whose step was
    # too short for its bound is not rolled back.
    return Check(name, UNKNOWN, said)


_CHECKS = {"shadow_errors": _shadow_errors, "error_ratio": _errors, "latency_p99": _latency, "flip_rate": _flips}
