"""What a step, and a plan, should take at the measured traffic: the requests each step sees by its duration, the
median and 90th-percentile time to its verdict, the chance it holds past its hold (the rollout pauses), and the
canary requests a failing candidate answers: by the first look (one failing every call), and at most (one just
beyond a budget, which the checks may take the whole step and its hold to show).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from trainserve.rollout.plan import CANARY, PROMOTE, Plan, Step
from trainserve.rollout.sizing.simulate import Situation, looks, pass_times, quantile


@dataclass(frozen=True)
class Expected:
    """One step at the traffic (seconds, requests)."""

    step: Step
    hold: float  # the step's hold: its own, else --max-hold
    requests: float  # its own units by its duration: canary requests, or the shadow's copies
    median: float  # time to its verdict (it advances at its first look past its duration that passes)
    p90: float
    pause: float  # the chance it is still inconclusive at duration + hold
    first_look: float  # canary requests answered before the first look
    most: float  # canary requests answered by the end of its hold
    verdicts: np.ndarray = field(repr=False, compare=False)  # the simulated times to a verdict (inf: paused)

    def as_record(self) -> dict:
        said = {k: getattr(self, k) for k in ("hold", "requests", "median", "p90", "pause", "first_look", "most")}
        return {"step": self.step.words(), **{k: round(v, 4) for k, v in said.items()}}


def on_looks(seconds: float, interval: float) -> float:
    """The first look at or after `seconds`."""
    return looks(seconds, interval) * interval


def expect_step(plan: Plan, index: int, situation: Situation, hold: float) -> Expected:
    """`plan`'s step `index` at the traffic, inconclusive for at most `hold` past its duration."""
    step = plan.steps[index]
    shadow, canary = plan.shadow_during(index), plan.canary_during(index)
    passing = pass_times(step, shadow, canary, situation, step.seconds + hold)
    return expected_of(step, canary, shadow, situation, hold, passing)


def expected_of(step: Step, canary: float, shadow: float, situation: Situation, hold: float, passing) -> Expected:
    """The step's Expected from its simulated pass times (seconds; inf: not within duration + hold)."""
    rate, interval = situation.traffic.rate, situation.interval
    starts = on_looks(step.seconds, interval)
    verdicts = np.where(passing <= step.seconds + hold, np.maximum(passing, starts), math.inf)
    canary_rate = rate * canary / 100
    units = canary_rate if step.kind == CANARY else rate * (1 - situation.traffic.error_share) * shadow / 100
    return Expected(
        step,
        hold,
        units * step.seconds,
        float(quantile(verdicts, 50)),
        float(quantile(verdicts, 90)),
        float(np.mean(np.isinf(verdicts))),
        canary_rate * interval,
        canary_rate * (step.seconds + hold),
        verdicts,
    )


def expect_plan(plan: Plan, situation: Situation, max_hold: float) -> list[Expected]:
    """Every step but the promotion, each inconclusive for at most its own hold, else --max-hold."""
    return [
        expect_step(plan, i, situation, step.hold if step.hold is not None else max_hold)
        for i, step in enumerate(plan.steps)
        if step.kind != PROMOTE
    ]


def totals(expected: list[Expected]) -> tuple[float, float, float]:
    """The whole plan's median and 90th-percentile time to promotion (inf: it would pause), and its most."""
    whole = np.sum([e.verdicts for e in expected], axis=0)
    most = sum(e.step.seconds + e.hold for e in expected)
    return float(quantile(whole, 50)), float(quantile(whole, 90)), most
