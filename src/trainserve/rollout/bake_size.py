"""How long the bake lasts, resolved once at the rollout's start and kept in its START record (`bake`): --bake as
given, 0 for none, or `auto`, sized to the model's traffic as the plan `auto` sizes its steps:

    auto    the time by which the bake's slow-call check (trainserve.rollout.bake_checks) rolls back a version twice
            as slow as previous in 97 % of simulated bakes at the measured rate, judged against what previous
            showed over the plan's last step (its calls at the rate, less the canary's share, over the step's
            duration); at least FLOOR and at most CAP. Twice as slow is taken as SLOW_BAD of its calls above
            previous's p99 (previous: 1 %): a lognormal latency whose p99 is 10 times its median (sigma 1) doubled;
            a narrower latency puts more of a slower version's calls above the p99 (17 % at sigma 0.5), so it is
            shown sooner. Where no rate is known (an explicit plan without --prometheus or --expected-rate): UNSIZED.

FLOOR: errors and latency that only the promotion's full traffic shows (a cache, a batch size, a memory limit)
show within minutes; a quarter of an hour sees them at any rate. CAP: the bake holds the next rollout of the model
(the controller owns its labels until the bake ends).
"""

from __future__ import annotations

import math

import numpy as np

from trainserve.rollout.bake_checks import slow_check
from trainserve.rollout.plan import AUTO
from trainserve.rollout.rollout_config import RolloutConfig, StepGate
from trainserve.rollout.sizing.auto import Resolved
from trainserve.rollout.sizing.choose import hours
from trainserve.rollout.sizing.expect import on_looks
from trainserve.rollout.sizing.simulate import SEED, SIMULATIONS, SLOW_SHARE, looks, quantile

FLOOR, CAP, UNSIZED = 900.0, 7200.0, 1800.0
SLOW_BAD = 0.05
QUANTILE = 97
ANY = {"le": "1", "lower": "1", "weight": 0.0}  # a threshold to judge against: its place does not matter here


def bake_of(config: RolloutConfig, resolved: Resolved) -> dict:
    """The START record's `bake`: its seconds (0: none), whether `auto` sized it, and why, in words."""
    if config.bake != AUTO:
        seconds = float(config.bake)
        said = f"bake {hours(seconds)} (--bake)" if seconds else "no bake (--bake 0): the rollout ends at promotion"
        return {"seconds": seconds, "auto": False, "said": said}
    situation = resolved.situation
    if situation is None or not resolved.expected:
        said = f"bake {hours(UNSIZED)} (auto, no rate known to size it)"
        return {"seconds": UNSIZED, "auto": True, "said": said}
    last = len(resolved.plan.steps) - 2
    rate, step = situation.traffic.rate, resolved.plan.steps[last]
    before = rate * (1 - resolved.plan.canary_during(last) / 100) * step.seconds
    shown = quantile(rollback_times(rate, before, situation.gate, situation.interval), QUANTILE)
    seconds = min(max(on_looks(shown, situation.interval), FLOOR), CAP) if math.isfinite(shown) else CAP
    within = f"within {hours(shown)}" if math.isfinite(shown) else f"not within {hours(CAP)}"
    said = (
        f"bake {hours(seconds)} (auto): a version twice as slow ({SLOW_BAD:.0%} of its calls above previous's p99) "
        f"rolled back {within} in {QUANTILE} % of simulated bakes at {rate:.3g} requests/s, against previous's "
        f"{before:,.0f} calls over step {last + 1}; at least {hours(FLOOR)}, at most {hours(CAP)}"
    )
    return {"seconds": seconds, "auto": True, "said": said}


def rollback_times(rate: float, before: float, gate: StepGate, interval: float, horizon: float = CAP) -> np.ndarray:
    """Seconds from the bake's start to the look at which the slow-call check fails a version with SLOW_BAD of its
    calls above previous's p99, against `before` calls of previous's (SLOW_SHARE above it) and previous's copies of
    each of its calls (the shadow at 100 %, SLOW_SHARE above it), per simulated bake
    (inf: not within `horizon`). Seeded by the rate: the dry run and the start say the same."""
    rng = np.random.default_rng([SEED, int(rate * 1000), int(before)])
    count = looks(horizon, interval)
    calls = rng.poisson(rate * interval, (SIMULATIONS, count))
    timed, slow = np.cumsum(calls, axis=1), np.cumsum(rng.binomial(calls, SLOW_BAD), axis=1)
    copies_slow = np.cumsum(rng.binomial(calls, SLOW_SHARE), axis=1)  # previous's copies of every call: the guard
    earlier = rng.binomial(int(round(before)), SLOW_SHARE, SIMULATIONS)
    found = []
    for sim in range(SIMULATIONS):
        baseline = {"slow": int(earlier[sim]), "timed": int(round(before)), "threshold": ANY, "step": None}

        def fails(look: int, sim=sim, baseline=baseline) -> bool:
            counts = {"stable_slow": slow[sim, look], "stable_latency_count": timed[sim, look]}
            counts.update(copies_slow=copies_slow[sim, look], copies_latency_count=timed[sim, look])
            return slow_check(counts, baseline, gate).result == "fail"

        found.append(_first(fails, count))
    return interval * np.array(found, dtype=float)


def _first(holds, count: int) -> float:
    """The first look (from 1) from which `holds(look)` holds (bisection: the bounds narrow as the counts grow);
    inf when not by the last."""
    if not holds(count - 1):
        return math.inf
    low, high = -1, count - 1
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if holds(middle) else (middle, high)
    return high + 1
