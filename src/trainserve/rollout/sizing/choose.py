"""The plan `auto`: a shadow step, then one or two canary steps, each sized from the simulated times at which a
candidate inside every budget passes (trainserve.rollout.sizing.simulate):

    duration   the median of those times (the least a step is watched: the evidence a typical run needs); the
               shadow step's, at least until a classifier flipping one class (simulate.CLASS_SHARE of its answers)
               at 2.5 times its class budget is rolled back in 97 % of runs: the overall flip rate passes it, and
               the step would advance at its duration
    hold       up to their 99th percentile (a candidate inside every budget pauses in about 1 % of steps), and
               at least until a candidate flipping (or differing) 1.5 times its budget is rolled back in 97 % of
               runs
    share      among SHARES whose first look exposes at most --max-exposure canary requests (what a candidate
               failing every call answers before the controller can see it) and whose steps fit --max-duration
               (duration + hold, summed: the longest the plan can take without pausing): the smallest whose plan
               takes at most --target-duration at the median, else the quickest
    second     a larger canary share (5 times the first, at most 50 %) when it still fits, so that the candidate
               answers more of the traffic, judged again, before it answers all of it

No share fits: refused before anything moves, with the time the smallest share that could decide would need at the
measured rate, and what to change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainserve.errors import TrainserveError
from trainserve.rollout.plan import CANARY, PROMOTE, SHADOW, Plan, Step
from trainserve.rollout.sizing.expect import Expected, expected_of, on_looks, totals
from trainserve.rollout.sizing.simulate import Situation, fail_times, pass_times, quantile

SHARES = (1.0, 2.0, 5.0, 10.0, 25.0, 50.0)
SECOND = {1.0: 5.0, 2.0: 10.0, 5.0: 25.0, 10.0: 50.0}
SHADOW_PERCENT = 100.0
HOLD_QUANTILE = 99
FAIL_QUANTILE = 97  # a candidate flipping beyond its budget rolled back by the hold's end in 97 % of runs


class PlanRefused(TrainserveError):
    """No plan decides within the limits at the measured traffic: nothing moved."""


@dataclass(frozen=True)
class Limits:
    """What the user bounds a plan by (--target-duration, --max-duration, --max-exposure)."""

    target: float
    most: float
    exposure: float


def size_plan(situation: Situation, limits: Limits) -> tuple[Plan, list[Expected]]:
    """The plan `auto` at the traffic (see the module's docstring); PlanRefused when none fits. Shares are tried
    from the smallest, each step simulated once."""
    sized: dict[tuple[str, float], Expected] = {}

    def step(kind: str, percent: float) -> Expected:
        if (kind, percent) not in sized:
            sized[kind, percent] = _sized(kind, percent, situation, limits.most)
        return sized[kind, percent]

    shares = _exposable(situation, limits.exposure)
    fitting = []
    for share in shares:
        steps = _steps(step, share, shares, limits)
        if steps is not None and totals(steps)[0] <= limits.target:
            return _plan(steps)
        fitting += [steps] if steps is not None else []
    if not fitting:
        raise _too_long(situation, step(SHADOW, SHADOW_PERCENT), shares[-1], limits.most)
    return _plan(min(fitting, key=lambda steps: totals(steps)[0]))


def _plan(steps: list[Expected]) -> tuple[Plan, list[Expected]]:
    return Plan((*(e.step for e in steps), Step(PROMOTE, 100.0, 0.0))), steps


def _exposable(situation: Situation, exposure: float) -> list[float]:
    """The shares whose canary answers at most `exposure` requests before the first look."""
    rate, interval = situation.traffic.rate, situation.interval
    shares = [s for s in SHARES if rate * s / 100 * interval <= exposure]
    if shares:
        return shares
    least = rate * SHARES[0] / 100 * interval
    raise PlanRefused(
        f"a {SHARES[0]:g}% canary at {rate:.3g} requests/s answers about {least:,.0f} requests before the first look, "
        f"more than --max-exposure {exposure:,.0f}: expected a larger --max-exposure, a shorter --interval, or an "
        "explicit --plan"
    )


def _steps(step, share: float, shares: list[float], limits: Limits) -> list[Expected] | None:
    """The shadow and canary steps from `share` on (`step(kind, percent)` sizes one), when they fit
    --max-duration (else None)."""
    steps = [step(SHADOW, SHADOW_PERCENT), step(CANARY, share)]
    second = SECOND.get(share)
    if second is not None and second in shares:
        longer = [*steps, step(CANARY, second)]
        steps = longer if _most(longer) <= limits.most else steps
    return steps if _most(steps) <= limits.most else None


def _sized(kind: str, percent: float, situation: Situation, horizon: float) -> Expected:
    """A step of `kind` and share sized from its pass times within `horizon` (its hold inf where more than 1 % of
    them are beyond it: it could not decide in time)."""
    shadow, canary = (percent, 0.0) if kind == SHADOW else (SHADOW_PERCENT, percent)
    probe = Step(kind, percent, 1.0)  # the checks depend on the kind only
    passing = pass_times(probe, shadow, canary, situation, horizon)
    tail = quantile(passing, HOLD_QUANTILE)
    median = quantile(passing, 50)
    if kind == SHADOW:  # where a flipping candidate is to be rolled back, before any client gets its answers
        tail = max(tail, quantile(fail_times(probe, shadow, canary, situation, horizon), FAIL_QUANTILE))
        one_class = quantile(fail_times(probe, shadow, canary, situation, horizon, one_class=True), FAIL_QUANTILE)
        median, tail = max(median, one_class), max(tail, one_class)
    if not math.isfinite(tail):  # runs undecided within the horizon: it cannot be held for
        return expected_of(Step(kind, percent, horizon, 0.0), canary, shadow, situation, math.inf, passing)
    duration = on_looks(median, situation.interval)
    hold = max(on_looks(tail, situation.interval) - duration, situation.interval)
    return expected_of(Step(kind, percent, duration, hold), canary, shadow, situation, hold, passing)


def _most(steps: list[Expected]) -> float:
    return sum(e.step.seconds + e.hold for e in steps)


def _too_long(situation: Situation, shadow: Expected, share: float, max_duration: float) -> PlanRefused:
    """The refusal, with a --max-duration that would decide: the plan at the largest share simulated over a longer
    horizon, with a fifth more for the simulation's own noise, in half hours."""
    traffic = situation.traffic
    longest = _sized(CANARY, share, situation, max(max_duration, 1.0) * 8)
    needs = _most([shadow, longest])
    enough = f"--max-duration {hours(math.ceil(needs * 1.2 / 1800) * 1800)}" if math.isfinite(needs) else None
    said = f"about {hours(needs)}" if enough else f"more than {hours(max_duration * 8)}"
    return PlanRefused(
        f"no plan decides within --max-duration {hours(max_duration)} at {traffic.describe()}: a {share:g}% canary "
        f"needs {said} for a candidate inside every budget to pass (99 % of runs) and one flipping 1.5 times its "
        f"budget to be rolled back (97 %); expected "
        f"{enough or 'a longer --max-duration'}, larger --gate-max-error-increase / --gate-max-slow-increase "
        "budgets, or an explicit --plan (a step that cannot decide pauses)"
    )


def hours(seconds: float) -> str:
    """`1h 40m`, `25m`, `45s`: a duration as a person reads it."""
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes = math.ceil(seconds / 60)
    return f"{minutes // 60}h {minutes % 60}m" if minutes >= 60 else f"{minutes}m"
