"""The plan a rollout follows, resolved once at its start and kept in its START record (a resumed rollout follows
the recorded plan, whatever the traffic is then): --plan as given, or `auto` sized to the traffic
(trainserve.rollout.sizing.choose); and, for either, what each step should take at the traffic, said before
anything moves (the dry run prints it, the controller logs it, the history keeps it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from trainserve.errors import TrainserveError
from trainserve.rollout.plan import AUTO, Plan
from trainserve.rollout.prometheus import Prometheus
from trainserve.rollout.rollout_config import RolloutConfig
from trainserve.rollout.sizing.choose import Limits, hours, size_plan
from trainserve.rollout.sizing.expect import Expected, expect_plan, totals
from trainserve.rollout.sizing.simulate import Situation
from trainserve.rollout.sizing.traffic import Traffic, read_traffic

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Resolved:
    """The plan, and what its steps should take at the traffic (none where the traffic could not be read)."""

    plan: Plan
    sized: bool  # chosen by `auto`
    situation: Situation | None = None
    expected: list[Expected] = field(default_factory=list)

    def record(self) -> dict | None:
        """The START record's `sizing`: the traffic and each step's expectations."""
        if self.situation is None:
            return None
        median, p90, most = totals(self.expected)
        traffic = self.situation.traffic
        return {
            "auto": self.sized,
            "rate": traffic.rate,
            "error_share": traffic.error_share,
            "source": traffic.source,
            "median_seconds": median,
            "p90_seconds": p90,
            "most_seconds": most,
            "steps": [e.as_record() for e in self.expected],
        }

    def lines(self) -> list[str]:
        """What the plan should take, as a person reads it."""
        head = f"plan {'auto' if self.sized else 'as given'}: {self.plan.text()}"
        if self.situation is None:
            return [head, "  (no traffic to say what it should take: expected --prometheus or --expected-rate)"]
        median, p90, most = totals(self.expected)
        return [
            head,
            f"  at {self.situation.traffic.describe()}",
            f"  promoted in about {hours(median)} (90 %: {hours(p90)}); at most {hours(most)} before a step would "
            "pause",
            *(f"  step {i + 1}: {step_words(e)}" for i, e in enumerate(self.expected)),
        ]


def step_words(e: Expected) -> str:
    unit = "canary requests" if e.step.kind == "canary" else "shadow copies"
    said = (
        f"{e.step.words()}: about {e.requests:,.0f} {unit} by its duration; a verdict in {hours(e.median)} at the "
        f"median, {hours(e.p90)} at the 90th percentile; pauses in {e.pause:.1%} of runs"
    )
    if e.step.kind == "canary":
        said += (
            f"; exposure: about {e.first_look:,.0f} canary requests before the first look, at most "
            f"{e.most:,.0f} by its hold's end"
        )
    return said


def traffic_of(config: RolloutConfig, prometheus: Prometheus | None, model: str, now: float) -> Traffic:
    """--expected-rate, else the model's traffic read from Prometheus."""
    if config.expected_rate is not None:
        return Traffic(config.expected_rate)
    if prometheus is None:
        raise TrainserveError("plan auto: expected --prometheus URL (the model's request rate) or --expected-rate")
    return read_traffic(prometheus, model, config.proxy_job, config.rate_history, now, config.max_duration)


def resolve(
    config: RolloutConfig, prometheus: Prometheus | None, model: str, offline: dict, flips: bool, now: float
) -> Resolved:
    """The plan and its expectations; `auto` refused (PlanRefused, or no traffic) before anything moves. An
    explicit plan's expectations are best effort: a rate that cannot be read is logged, not a refusal."""
    if config.plan != AUTO:
        try:
            traffic = traffic_of(config, prometheus, model, now)
        except TrainserveError as exc:
            log.info("model %s: what the plan should take is not known: %s", model, exc)
            return Resolved(config.plan, False)
        situation = Situation(traffic, config.gate, offline, flips, config.interval)
        return Resolved(config.plan, False, situation, expect_plan(config.plan, situation, config.max_hold))
    situation = Situation(traffic_of(config, prometheus, model, now), config.gate, offline, flips, config.interval)
    plan, expected = size_plan(situation, Limits(config.target_duration, config.max_duration, config.max_exposure))
    return Resolved(plan, True, situation, expected)
