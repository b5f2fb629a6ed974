"""How often `trainserve rollout`'s checks roll back a candidate identical to stable, how fast they roll back a
bad one, and whether a rollout ends within the time its plan stated, on simulated traffic judged by the
controller's own code (trainserve.rollout.analysis: `checks`, then `decide`, at every look; the plan `auto` sized
by trainserve.rollout.sizing at the candidate's rate and stable's error share, as the controller sizes it).

Traffic: Poisson arrivals at 1, 10 and 100 requests/s, one example each, looked at every --interval over the plan
(`auto`, the default, and the former default `shadow 10m, 5% 10m, 25% 10m, 100%` beside it), a step that holds
paused after its hold (--max-hold where the plan sets none), as the controller does.
Each look's counts are measure's contract, since the step began:

    routes     each request to the canary with the step's share, else to stable; the shadow copies every request
               stable answered (the shadow's share), and the candidate answers or fails each copy
    errors     stable fails a share `error` of requests; the same requests fail on the candidate (a request's own
               fault), which also fails a share `own` of the rest (its own fault: on copies too); a share
               `transient` of every call fails at random, either version's, shadow copies included
    latency    lognormal (sigma 0.5) around a median drawn per rollout between 3.7 and 6.7 ms, so that stable's p99
               falls anywhere between two of the histogram's bounds (10 us x 1.8^i); each step's threshold is
               measure's, from stable's calls in the 5 minutes before the step (the request rate x 300 of them,
               drawn), and each version's calls above its bucket's bound and above the bound below are counted, then
               weighted by measure (`slow_calls`); `2x slower` doubles every call of the candidate
    flips      offline: eval's 200 discordant pairs of 10,000 (a 2 % disagreement: budget 4 % by the defaults);
               live, the candidate flips each classified pair at its rate

Printed per plan, rate and candidate: the share of rollouts refused before they start (auto: no plan decides within
--max-duration), rolled back, promoted, promoted within the plan's stated most (every step's duration and hold)
and within its stated 90th percentile, paused, rolled back by the end of the first canary step, and the canary
requests (clients' answers from the candidate) seen by the rollback (median, 95th percentile). `resumed`: a
paused rollout run again once, its step's counts kept (as the controller resumes). Seeded: the same numbers every
run.

The bake after the promotion (`--bake-only` prints its table alone): the plan `auto` and the bake `--bake auto`
sizes for it at each rate; previous's calls over the plan's last step (its duration, the canary's share off, with
that step's threshold) are the baseline; then the promoted version answers every request, the requests it answered
copied to previous at the plan's shadow share, judged by trainserve.rollout.bake_checks at every look. Printed: the
share of bakes that rolled the version back, and the median time to it. `once promoted`: the version fails or is
slower only once it answers all the traffic (it passed its steps).

    python bench/rollout_checks.py [--rollouts 400] [--seed 0] [--bake-only]
"""

from __future__ import annotations

import argparse
import math
import subprocess
from dataclasses import dataclass, field, replace
from statistics import NormalDist

import numpy as np

from trainserve.exposition import LATENCY_BUCKETS
from trainserve.rollout import analysis, bake_checks, measure
from trainserve.rollout.bake_size import bake_of
from trainserve.rollout.plan import AUTO, CANARY, EXAMPLE_PLAN, Plan, parse_plan
from trainserve.rollout.rollout_config import RolloutConfig, StepGate
from trainserve.rollout.sizing.auto import Resolved
from trainserve.rollout.sizing.choose import Limits, PlanRefused, hours, size_plan
from trainserve.rollout.sizing.expect import totals
from trainserve.rollout.sizing.simulate import Situation
from trainserve.rollout.sizing.traffic import Traffic as Rate
from trainserve.stats.sequential import difference_sequence

RATES = (1, 10, 100)
OFFLINE_RATE = 0.02
OFFLINE = {"disagreement": {"source": "eval", "count": 200, "examples": 10_000, "candidate": 2, "baseline": 1}}
SIGMA, MEDIAN = 0.5, 0.005  # seconds
BUCKET = 1.8  # the proxy's histogram: 10 us x 1.8^i
BEFORE = 300.0  # seconds of stable's calls a step's threshold is taken from
NO_SHADOW = "5% 10m, 25% 10m, 100%"
KEYS = (
    *("canary_requests", "canary_errors", "stable_requests", "stable_errors"),
    *("candidate_latency_count", "candidate_above_bound", "candidate_above_lower"),
    *("stable_latency_count", "stable_above_bound", "stable_above_lower"),
    *("shadow_pairs", "shadow_flips", "shadow_classified", "shadow_compared", "shadow_incomparable"),
    *("shadow_errors", "shadow_dropped", "shadow_shed", "shadow_cut"),
)


@dataclass(frozen=True)
class Candidate:
    name: str
    error: float = 0.0  # stable's error share (requests that fail on both versions)
    own: float = 0.0  # the candidate's own failures among the rest
    transient: float = 0.0  # every call's chance to fail at random, either version's, shadow copies included
    slower: float = 1.0
    flips: float = OFFLINE_RATE
    plan: str = AUTO
    resumed: bool = False
    bad: bool = False


CANDIDATES = (
    Candidate("identical, 0% errors"),
    Candidate("identical, 1% errors", error=0.01),
    Candidate("identical, 5% errors", error=0.05),
    Candidate("identical, 1% transient errors", transient=0.01),
    Candidate("identical, 5% transient errors", transient=0.05),
    Candidate("identical, 30% outage on both", error=0.30),
    Candidate("identical, 1% errors, resumed", error=0.01, resumed=True),
    Candidate("flips at the budget (4%), resumed", flips=2 * OFFLINE_RATE, resumed=True),
    Candidate("fails 10% (1% errors)", error=0.01, own=0.10, bad=True),
    Candidate("fails 10%, no shadow step", error=0.01, own=0.10, plan=NO_SHADOW, bad=True),
    Candidate("2x slower", slower=2.0, bad=True),
    Candidate("flips 3x offline (6%)", flips=3 * OFFLINE_RATE, bad=True),
)


@dataclass
class Outcome:
    result: str  # rolled back, promoted, paused, refused
    step: int
    canary: int
    seconds: float = 0.0  # from the first step's start to the end


@dataclass(frozen=True)
class Stated:
    """The plan a rollout follows and what it said before it started (auto: sized; else the plan as given)."""

    plan: Plan | None  # None: refused before it starts
    most: float = math.inf
    p90: float = math.inf


@dataclass
class Traffic:
    """One rollout's requests: the candidate, the request rate and the latency's scale."""

    candidate: Candidate
    rate: float
    rng: np.random.Generator
    median: float = field(init=False)

    def __post_init__(self):
        self.median = MEDIAN * BUCKET ** self.rng.uniform(-0.5, 0.5)

    def threshold(self) -> dict | None:
        """measure's threshold from stable's calls in the BEFORE seconds before a step, in the proxy's buckets."""
        micros = 1e6 * self.rng.lognormal(math.log(self.median), SIGMA, self.rng.poisson(self.rate * BEFORE))
        within = np.searchsorted(np.sort(micros), LATENCY_BUCKETS, side="right")
        return measure.threshold([*zip((f"{b:g}" for b in LATENCY_BUCKETS), within), ("+Inf", len(micros))])

    def slow_shares(self, limit: dict | None) -> tuple[tuple[float, float], tuple[float, float]]:
        """Each version's (candidate, stable) shares of calls above the threshold's bound and above the bound below."""
        if limit is None:
            return (0.0, 0.0), (0.0, 0.0)
        above = lambda bound, median: 1 - NormalDist().cdf(math.log(float(bound) / 1e6 / median) / SIGMA)  # noqa: E731
        return tuple(  # type: ignore[return-value]
            (above(limit["le"], median), above(limit["lower"], median))
            for median in (self.median * self.candidate.slower, self.median)
        )

    def accrue(self, counts: dict, seconds: float, canary: float, shadow: float, slow: tuple) -> None:
        c, rng = self.candidate, self.rng
        arrived = rng.poisson(self.rate * seconds)
        to_canary = rng.binomial(arrived, canary / 100)
        to_stable = arrived - to_canary
        stable_errors = rng.binomial(to_stable, c.error)
        stable_errors += rng.binomial(to_stable - stable_errors, c.transient)
        canary_errors = rng.binomial(to_canary, c.error)
        canary_errors += rng.binomial(to_canary - canary_errors, c.transient)
        canary_errors += rng.binomial(to_canary - canary_errors, c.own)
        copies = rng.binomial(to_stable - stable_errors, shadow / 100)  # of the requests stable answered
        failed = rng.binomial(copies, c.transient)  # a copy is a second call: it meets the transient errors too
        failed += rng.binomial(copies - failed, c.own)
        compared = copies - failed
        for key, n in (
            ("canary_requests", to_canary),
            ("canary_errors", canary_errors),
            ("stable_requests", to_stable),
            ("stable_errors", stable_errors),
            ("candidate_latency_count", to_canary),
            ("stable_latency_count", to_stable),
            ("shadow_compared", compared),
            ("shadow_errors", failed),
            ("shadow_pairs", compared),
            ("shadow_classified", compared),
            ("shadow_flips", rng.binomial(compared, c.flips)),
        ):
            counts[key] += int(n)
        for version, calls, (bound, lower) in zip(("candidate", "stable"), (to_canary, to_stable), slow):
            above_bound, near = rng.multinomial(calls, (bound, lower - bound, 1 - lower))[:2]
            counts[f"{version}_above_bound"] += int(above_bound)
            counts[f"{version}_above_lower"] += int(above_bound + near)


def stated(candidate: Candidate, rate: float, gate: StepGate, interval: float, max_hold: float) -> Stated:
    """The plan of `candidate`'s rollouts at `rate`: `auto` sized as the controller sizes it (the stable error share
    it would read from Prometheus: the candidate's `error`), else the plan as given."""
    if candidate.plan != AUTO:
        return Stated(parse_plan(candidate.plan))
    defaults = RolloutConfig()
    errors = candidate.error + (1 - candidate.error) * candidate.transient  # stable's share, as Prometheus shows it
    situation = Situation(Rate(rate, errors), gate, OFFLINE, True, interval)
    limits = Limits(defaults.target_duration, defaults.max_duration, defaults.max_exposure)
    try:
        plan, expected = size_plan(situation, limits)
    except PlanRefused:
        return Stated(None)
    _, p90, most = totals(expected)
    return Stated(plan, most, p90)


def roll_out(traffic: Traffic, plan: Plan, gate: StepGate, interval: float, max_hold: float) -> Outcome:
    """The controller's loop over the plan (trainserve.rollout.controller: look, decide, sleep), counts simulated."""
    canary_seen, elapsed = 0, 0.0
    for index, step in enumerate(plan.steps[:-1]):
        hold = step.hold if step.hold is not None else max_hold
        counts = dict.fromkeys(KEYS, 0)
        flips, limit = plan.shadow_during(index) > 0, traffic.threshold()
        shares = traffic.slow_shares(limit)
        now, held_since, resumed = 0.0, None, False
        while True:
            found = analysis.checks(step, flips, measure.step_counts(counts, limit), gate, OFFLINE)
            decision = analysis.decide(found, now >= step.seconds)
            if decision == analysis.ROLLBACK:
                return Outcome("rolled back", index, canary_seen + counts["canary_requests"], elapsed + now)
            if decision == analysis.ADVANCE:
                break
            if decision == analysis.HOLD:
                held_since = now if held_since is None else held_since
                if now - held_since >= hold:
                    if resumed or not traffic.candidate.resumed:
                        return Outcome("paused", index, canary_seen + counts["canary_requests"], elapsed + now)
                    resumed, held_since = True, now  # run again: a new controller holds up to its hold again
            left = step.seconds - now
            wait = min(interval, left) if left > 0 else interval
            traffic.accrue(counts, wait, plan.canary_during(index), plan.shadow_during(index), shares)
            now += wait
        canary_seen += counts["canary_requests"]
        elapsed += now
    return Outcome("promoted", len(plan.steps) - 1, canary_seen, elapsed)


def first_canary(plan: Plan) -> int:
    return next(i for i, s in enumerate(plan.steps) if s.kind == CANARY)


def row(candidate: Candidate, rate: float, said: Stated, outcomes: list[Outcome]) -> str:
    name = f"{candidate.name} | {'auto' if candidate.plan == AUTO else candidate.plan} | {rate:g}"
    if said.plan is None:
        return f"| {name} | refused | 100% | - | - | - | - | - | - | - |"
    n = len(outcomes)
    share = lambda result: sum(o.result == result for o in outcomes) / n  # noqa: E731
    within = lambda bound: sum(o.result == "promoted" and o.seconds <= bound for o in outcomes) / n  # noqa: E731
    back = [o for o in outcomes if o.result == "rolled back"]
    early = sum(o.step <= first_canary(said.plan) for o in back) / n
    canary = np.array([o.canary for o in back]) if back else None
    seen = "-" if canary is None else f"{np.median(canary):.0f} / {np.percentile(canary, 95):.0f}"
    most = "-" if math.isinf(said.most) else f"{hours(said.most)}: {within(said.most):.1%}"
    p90 = "-" if math.isinf(said.p90) else f"{hours(said.p90)}: {within(said.p90):.1%}"
    return (
        f"| {name} | {said.plan.text()} | 0% | {share('rolled back'):.1%} | {share('promoted'):.1%} | {most} | "
        f"{p90} | {share('paused'):.1%} | {early:.1%} | {seen} |"
    )


def needed_to_pass(rate: float, budget: float, share: float = 0.05) -> int:
    """The canary requests at which an identical candidate's expected counts (both versions at `rate`, the
    canary `share` of the requests) show the difference within `budget`: what a step needs to pass."""

    def within(n: int) -> bool:
        stable = round(n * (1 - share) / share)
        seen = ((round(rate * n), n), (round(rate * stable), stable))
        return difference_sequence(*seen, StepGate().alpha, analysis.CANARY_ALPHA)[1] <= budget

    high = 1
    while not within(high):
        high *= 2
    low = high // 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if within(middle) else (middle, high)
    return high


def cpu() -> str:
    text = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Model name")), "?")
    return f"CPU: {model}; AVX-512: {'yes' if 'avx512f' in text else 'no'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=400, help="simulated rollouts per rate and candidate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--interval", type=float, default=30.0, help="seconds between looks (--interval)")
    parser.add_argument("--max-hold", type=float, default=1800.0, help="seconds a step may hold (--max-hold)")
    parser.add_argument("--bake-only", action="store_true", help="only the bake's table")
    args = parser.parse_args()
    if args.bake_only:
        bake_rows(args.rollouts, args.seed, args.interval)
        return
    gate = StepGate()
    print(cpu())
    print(f"{args.rollouts} rollouts each, looks every {args.interval:g} s, --max-hold {args.max_hold:g} s; {gate}")
    print(
        "| candidate | plan | req/s | steps | refused | rolled back | promoted | promoted within the stated most "
        "| within the stated p90 | paused | rolled back by the first canary step's end "
        "| canary requests by the rollback (median / p95) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for candidate in (*CANDIDATES, *(replace(c, plan=EXAMPLE_PLAN) for c in CANDIDATES if c.plan == AUTO)):
        for k, rate in enumerate(RATES):
            said = stated(candidate, rate, gate, args.interval, args.max_hold)
            rng = np.random.default_rng([args.seed, [c.name for c in CANDIDATES].index(candidate.name), k])
            outcomes = [
                roll_out(Traffic(candidate, rate, rng), said.plan, gate, args.interval, args.max_hold)
                for _ in range(args.rollouts if said.plan is not None else 0)
            ]
            print(row(candidate, rate, said, outcomes), flush=True)
    budget = gate.max_error_increase
    print(
        f"canary requests an identical candidate needs to pass (expected counts, a 5% canary, budget +{budget:g}; "
        "the slow-call check as at 1.0%, stable's share above its p99):"
    )
    for level in (0.0, 0.002, 0.01, 0.05):
        print(f"  both at {level:.1%}: {needed_to_pass(level, budget):,}")


# -- the bake after the promotion (trainserve.rollout.bake) --------------------------------------------------------

BAKE_CANDIDATES = (
    Candidate("identical, 0% errors"),
    Candidate("identical, 1% errors", error=0.01),
    Candidate("identical, 1% transient errors", transient=0.01),
    Candidate("fails 10% once promoted", error=0.01, own=0.10, bad=True),
    Candidate("2x slower once promoted", slower=2.0, bad=True),
)
BAKE_KEYS = (*KEYS, "copies_latency_count", "copies_above_bound", "copies_above_lower")


def bake_plan(rate: float, gate: StepGate, interval: float) -> tuple[Plan, float, float] | None:
    """The plan `auto` at `rate` for an identical candidate, its bake as `--bake auto` sizes it (seconds), and its
    last step's canary share; None where the plan is refused before it starts."""
    situation = Situation(Rate(rate, 0.0), gate, OFFLINE, True, interval)
    defaults = RolloutConfig()
    try:
        plan, expected = size_plan(
            situation, Limits(defaults.target_duration, defaults.max_duration, defaults.max_exposure)
        )
    except PlanRefused:
        return None
    seconds = bake_of(defaults, Resolved(plan, True, situation, expected))["seconds"]
    return plan, seconds, plan.canary_during(len(plan.steps) - 2)


def accrue_bake(traffic: Traffic, counts: dict, seconds: float, shadow: float, slow: tuple) -> None:
    """`seconds` of the bake: the candidate, now stable, answers every request (its own failures on top of the
    requests' and the transient ones); the requests it answered are copied to previous with the shadow's share, and
    meet the transient errors; the candidate's calls are slow as its latency says, previous's copies as stable's."""
    c, rng = traffic.candidate, traffic.rng
    arrived = rng.poisson(traffic.rate * seconds)
    errors = rng.binomial(arrived, c.error)
    errors += rng.binomial(arrived - errors, c.transient)
    errors += rng.binomial(arrived - errors, c.own)
    copies = rng.binomial(arrived - errors, shadow / 100)
    failed = rng.binomial(copies, c.transient)
    compared = copies - failed
    for key, n in (
        *(("stable_requests", arrived), ("stable_errors", errors), ("stable_latency_count", arrived)),
        *(("shadow_compared", compared), ("shadow_errors", failed), ("copies_latency_count", compared)),
        *(("shadow_pairs", compared), ("shadow_classified", compared)),
        ("shadow_flips", rng.binomial(compared, c.flips)),
    ):
        counts[key] += int(n)
    for timed, calls, (bound, lower) in zip(("stable", "copies"), (arrived, compared), slow):
        above_bound, near = rng.multinomial(calls, (bound, lower - bound, 1 - lower))[:2]
        counts[f"{timed}_above_bound"] += int(above_bound)
        counts[f"{timed}_above_lower"] += int(above_bound + near)


def bake_out(traffic: Traffic, plan: Plan, seconds: float, gate: StepGate, interval: float) -> float:
    """One bake (the controller's bake_checks at every look): the baseline is stable's calls over the plan's last
    step (its duration at the rate, the canary's share off), with that step's threshold; then the bake's looks.
    Returns the seconds to its rollback (inf: kept)."""
    last = len(plan.steps) - 2
    limit = traffic.threshold()
    shares = traffic.slow_shares(limit)
    before = dict.fromkeys(KEYS, 0)
    traffic.accrue(before, plan.steps[last].seconds, plan.canary_during(last), 0.0, shares)
    state = {**(limit or {"le": None}), "counts": before}
    baseline = bake_checks.baseline_of(state, last)
    counts, now = dict.fromkeys(BAKE_KEYS, 0), 0.0
    while now < seconds:
        found = bake_checks.bake_checks(measure.step_counts(counts, limit), baseline, gate, OFFLINE, True)
        if any(c.result == analysis.FAIL for c in found):
            return now
        accrue_bake(traffic, counts, interval, plan.shadow_during(last), shares)
        now += interval
    return math.inf


def bake_rows(rollouts: int, seed: int, interval: float) -> None:
    """The bake's table: per candidate and rate, the bake `auto` gave the plan `auto`, and the share of bakes that
    rolled the version back, with the median time to it."""
    gate = StepGate()
    print("| version after its promotion | req/s | plan | bake (auto) | rolled back by the bake | median time to it |")
    print("|---|---|---|---|---|---|")
    for i, candidate in enumerate(BAKE_CANDIDATES):
        for k, rate in enumerate(RATES):
            found = bake_plan(rate, gate, interval)
            if found is None:
                print(f"| {candidate.name} | {rate:g} | refused before it starts | - | - | - |")
                continue
            plan, seconds, _ = found
            rng = np.random.default_rng([seed, 1000 + i, k])
            times = np.array(
                [bake_out(Traffic(candidate, rate, rng), plan, seconds, gate, interval) for _ in range(rollouts)]
            )
            back = times[np.isfinite(times)]
            median = hours(float(np.median(back))) if back.size else "-"
            said = f"{plan.text()} | {hours(seconds)} | {back.size / rollouts:.1%} | {median}"
            print(f"| {candidate.name} | {rate:g} | {said} |", flush=True)


if __name__ == "__main__":
    main()
