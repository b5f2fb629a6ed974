"""A step's looks simulated at a request rate and judged by the controller's own checks (analysis.checks, then
analysis.decide), for a candidate inside every budget: identical to stable in errors and latency, flipping at its
offline disagreement. Seeded: the same traffic gives the same numbers at the dry run, at the start and in the
history.

    requests   Poisson arrivals at the rate, one example each; the canary's share to the candidate, the rest to
               stable; each version fails a request with stable's error share
    latency    each version has 1 % of its calls above stable's p99 (what the p99 means), drawn per call; the
               candidate's shadow copies too
    shadow     every request stable answered copied with the shadow's share; a copy fails as a request does; a
               classifier's copy flips with the offline disagreement, counted by stable's class too (one class of
               CLASS_SHARE of the copies, the rest as another); a regression model's differs beyond the tolerance
               with replay's share beyond it

A candidate beyond its budget (flipping, or differing, FLIPPING times it) is simulated too, so that a step's hold
also lasts until the check fails it: a hold sized for a good candidate alone would pause a bad one that the check
needs a little longer to show beyond its budget. So is a classifier flipping one class of CLASS_SHARE of the copies
at CLASS_FLIPPING times its class budget and the rest at the offline disagreement (by the defaults and a 2 %
disagreement: 30 % of a class, 3.4 % overall), which the overall flip rate passes: the shadow step lasts until
flip_classes has rolled it back (trainserve.rollout.sizing.choose).

Each simulated step is looked at every --interval (every MAX_LOOKS-th of the horizon where that is coarser: the
times are then that coarse); the time it would pass is its first look at which every check passes, found by
bisection over the looks (the checks' bounds narrow as counts grow, so once passing they stay passing in all but a
few paths).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from trainserve.rollout import analysis
from trainserve.rollout.measure import KEYS
from trainserve.rollout.plan import Step
from trainserve.rollout.rollout_config import StepGate
from trainserve.rollout.shadow_checks import anchored_budget
from trainserve.rollout.sizing.traffic import Traffic

SLOW_SHARE = 0.01  # stable's calls above its own p99
SIMULATIONS = 400
FLIPPING = 1.5  # the flip rate of the bad candidate a hold must wait for, as a multiple of the flip budget
CLASS_SHARE = 0.05  # the one-class flipper's class, a share of the classified copies
CLASS_FLIPPING = 2.5  # its flip rate, as a multiple of the class budget (--gate-flip-class-slack x the flip budget)
MAX_LOOKS = 1000
SEED = 0


@dataclass(frozen=True)
class Situation:
    """What a step is judged on besides its own routing: the traffic, the gate, the offline evidence (the START
    record's `offline`), whether the shadow's answers are compared (a classifier's flips, or a regression model's
    differences where `offline` anchors them), and the looks' interval. `flipped_class`: the flip rate of one class
    of CLASS_SHARE of the copies, the rest flipping at the offline disagreement (None: every class alike)."""

    traffic: Traffic
    gate: StepGate
    offline: dict
    flips: bool
    interval: float
    flipped_class: float | None = None

    @property
    def anchor(self) -> str:
        """The offline count the compared answers are anchored on: `difference` (regression) or `disagreement`."""
        return "difference" if self.offline.get("difference") else "disagreement"

    def flip_rate(self) -> float:
        """The candidate's live flip rate, or share differing beyond the tolerance: the offline share (or the rate
        `flipping` set)."""
        found = self.offline.get(self.anchor) or {}
        if "rate" in found:
            return found["rate"]
        return found["count"] / found["examples"] if found.get("examples") else 0.0

    def flipping(self) -> Situation | None:
        """The same traffic with a candidate flipping (or differing) FLIPPING times its budget (None: nothing
        compared)."""
        budget = anchored_budget(self.offline.get(self.anchor), self.gate)
        if not self.flips or budget is None:
            return None
        rate = min(FLIPPING * budget[0], 1.0)
        return replace(self, offline={self.anchor: {**self.offline[self.anchor], "rate": rate}})

    def one_class_flipping(self) -> Situation | None:
        """The same traffic with a classifier flipping one class of CLASS_SHARE at CLASS_FLIPPING times its class
        budget, the rest as offline (None: no classes compared, or a budget that times is more than every pair)."""
        budget = anchored_budget(self.offline.get("disagreement"), self.gate)
        if not self.flips or self.anchor != "disagreement" or budget is None:
            return None
        flipped = CLASS_FLIPPING * self.gate.flip_class_slack * budget[0]
        return replace(self, flipped_class=flipped) if flipped <= 1 else None  # else no class can flip that much


def quantile(values, percent: float) -> float:
    """The `percent` percentile, an observed value (inf where that many runs never passed)."""
    return float(np.percentile(values, percent, method="higher"))


def looks(seconds: float, interval: float) -> int:
    return max(1, math.ceil(seconds / interval - 1e-9))


def pass_times(step: Step, shadow: float, canary: float, situation: Situation, horizon: float) -> np.ndarray:
    """Seconds from the step's start to its first look at which every check passes, per simulated rollout (inf:
    not within `horizon`)."""
    return _decision_times(step, shadow, canary, situation, horizon, analysis.ADVANCE)


def fail_times(
    step: Step, shadow: float, canary: float, situation: Situation, horizon: float, one_class: bool = False
) -> np.ndarray:
    """Seconds to the look that rolls back a candidate flipping (or differing) beyond its budget, or (`one_class`)
    flipping one class beyond its class budget (zeros: nothing compared to judge it by)."""
    bad = situation.one_class_flipping() if one_class else situation.flipping()
    if bad is None or shadow <= 0:
        return np.zeros(SIMULATIONS)
    return _decision_times(step, shadow, canary, bad, horizon, analysis.ROLLBACK)


def _decision_times(
    step: Step, shadow: float, canary: float, situation: Situation, horizon: float, decision: str
) -> np.ndarray:
    rng = np.random.default_rng([SEED, int(canary * 100), int(shadow * 100), int(situation.traffic.rate * 1000)])
    every = max(situation.interval, horizon / MAX_LOOKS)
    counts = _cumulative_counts(rng, shadow, canary, situation, every, looks(horizon, every))
    flips = situation.flips and shadow > 0
    judged = lambda sim, look: _decides(step, flips, counts, sim, look, situation, decision)  # noqa: E731
    count, found = counts["canary_requests"].shape[1], []
    for sim in range(SIMULATIONS):  # each search starts where the runs so far ended: most end near there
        ended = sorted(look for look in found if math.isfinite(look))
        hint = int(ended[len(ended) // 2]) - 1 if ended else count // 2
        found.append(_first_decided(sim, judged, count, hint))
    return every * np.array(found)


def _first_decided(sim: int, judged, count: int, hint: int) -> float:
    """The first look (from 1) at which `judged(sim, look)` holds, taken as holding from there on (inf: not by the
    last): galloping from `hint` to a bracket, then bisection."""
    if judged(sim, hint):
        low, high, step = hint - 1, hint, 1  # judged(high) holds; judged(low) is taken as not
        while low >= 0 and judged(sim, low):
            high, low, step = low, max(low - 2 * step, -1), 2 * step
    else:
        low, high, step = hint, hint + 1, 1
        while high < count and not judged(sim, high):
            low, high, step = high, min(high + 2 * step, count), 2 * step
        if high >= count:
            return math.inf
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if judged(sim, middle) else (middle, high)
    return high + 1


def _decides(step: Step, flips: bool, counts: dict, sim: int, look: int, situation: Situation, decision: str) -> bool:
    seen = {key: float(values[sim, look]) for key, values in counts.items()}
    return analysis.reaches(step, flips, seen, situation.gate, situation.offline, decision)


def _cumulative_counts(
    rng, shadow: float, canary: float, situation: Situation, every: float, count: int
) -> dict[str, np.ndarray]:
    """Every key of measure's counts, cumulative at each of `count` looks `every` seconds (SIMULATIONS x count)."""
    size, traffic = (SIMULATIONS, count), situation.traffic
    arrived = rng.poisson(traffic.rate * every, size)
    to_canary = rng.binomial(arrived, canary / 100)
    to_stable = arrived - to_canary
    stable_errors = rng.binomial(to_stable, traffic.error_share)
    copies = rng.binomial(to_stable - stable_errors, shadow / 100)
    copy_errors = rng.binomial(copies, traffic.error_share)
    compared = copies - copy_errors
    per_look = {
        "canary_requests": to_canary,
        "canary_errors": rng.binomial(to_canary, traffic.error_share),
        "stable_requests": to_stable,
        "stable_errors": stable_errors,
        "candidate_latency_count": to_canary,
        "candidate_slow": rng.binomial(to_canary, SLOW_SHARE),
        "stable_latency_count": to_stable,
        "stable_slow": rng.binomial(to_stable, SLOW_SHARE),
        "copies_latency_count": compared,
        "copies_slow": rng.binomial(compared, SLOW_SHARE),
        "shadow_compared": compared,
        "shadow_errors": copy_errors,
        "shadow_pairs": compared,
        **_compared(rng, compared, situation),
    }
    zeros = np.zeros(size, int)  # never counted here (shed, dropped copies): shared, read only
    keys = (*KEYS, *(key for key in per_look if ":" in key))
    return {key: np.cumsum(per_look[key], axis=1) if key in per_look else zeros for key in keys}


def _compared(rng, compared: np.ndarray, situation: Situation) -> dict[str, np.ndarray]:
    """The compared copies' counts per look: a classifier's flips, overall and by stable's class (a class of
    CLASS_SHARE, flipping at `flipped_class` where set, and the rest); a regression model's differences beyond the
    tolerance. Nothing where the answers are not compared."""
    if not situation.flips:
        return {}
    rate = situation.flip_rate()
    if situation.anchor == "difference":
        return {"shadow_tolerated": compared, "shadow_beyond": rng.binomial(compared, rate)}
    one = rng.binomial(compared, CLASS_SHARE)
    one_flips = rng.binomial(one, rate if situation.flipped_class is None else situation.flipped_class)
    rest_flips = rng.binomial(compared - one, rate)
    return {
        "shadow_classified": compared,
        "shadow_flips": one_flips + rest_flips,
        "shadow_class_pairs:0": one,
        "shadow_class_flips:0": one_flips,
        "shadow_class_pairs:other": compared - one,
        "shadow_class_flips:other": rest_flips,
    }
