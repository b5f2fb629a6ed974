"""A check's verdict: a quantity's anytime-valid bounds (trainserve.stats.sequential) against its budget, in the
words and numbers the history, the look lines and the decision report read (trainserve.rollout.analysis says
which checks a step has).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trainserve.rollout.rollout_config import StepGate
from trainserve.stats.sequential import confidence_sequence, difference_sequence

PASS, FAIL, UNKNOWN = "pass", "fail", "unknown"
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


Bounds = Callable[[int], tuple[float, float]]  # a quantity's bounds with n units seen


def one(events: int, alpha: float) -> Bounds:
    return lambda n: confidence_sequence(events, n, alpha)


def against(events: int, other: tuple[int, int], alpha: float) -> Bounds:
    """The difference from `other` (events, n) of `events` among n."""
    return lambda n: difference_sequence((events, n), other, alpha, CANARY_ALPHA)


def judge(name: str, what: str, seen: tuple[int, str], budget: float, bounds: Bounds, gate: StepGate) -> Check:
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


def share(events: float, n: int) -> str:
    count = f"{events:.1f}" if events != int(events) else f"{int(events)}"  # slow calls are weighted
    return f"{count}/{n} = {events / n:.4f}" if n else f"{count}/0"
