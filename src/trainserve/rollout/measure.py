"""What a rollout step has seen, from the proxy's series in Prometheus: the queries, a step's counts, and
whether they can be judged at this look.

    counts   every counter per proxy replica (`sum by (instance)` over the proxy's scrape job), a step's count the
             sum of the increases each replica showed between the looks that saw it (trainserve.rollout.counting):
             a missed scrape or a restart neither re-bases nor inflates a step; exact where increase() would
             extrapolate
    versions both from the same counters over the same step: the candidate's calls on route="canary", stable's on
             route="stable" (the proxy counts that route by the version that answered)
    errors   every status but OK and CANCELLED (ERRORS_EXCEPT) on both routes: on the canary route a rejection
             (INVALID_ARGUMENT, NOT_FOUND) is the candidate's doing, since stable's callers send the same requests;
             the recording rule trainserve:proxy_route_errors:ratio_rate5m and the canary alert count the same
    latency  each version's predict calls, and its calls above stable's p99 as histogram_quantile() places it
             (the dashboards' p99) over the 5 minutes before the step began: in the bucket (lower, le] where it
             falls, a share `weight` of that bucket's calls lies above it (the calls spread evenly in the bucket,
             as histogram_quantile() takes them). A call above `le` counts 1, one in that bucket `weight`: each
             version's slow count is above(le) + weight x (above(lower) - above(le)), stable's about 1 % of its
             calls wherever its p99 falls between two bounds 1.8x apart. (`le` alone, as before, put the threshold
             up to 1.8x above the p99, where a candidate twice as slow had as few as 2 % of its calls: a 1-point
             budget could not show it in a 5 % step.) Fixed for the step and kept in its state (a step that
             begins before stable has a p99 fixes it at its first look that has one, and counts both versions'
             latency from there)
    classes  the flip matrix's rows, per replica and stable's class: `shadow_class_pairs:<class>` and
             `shadow_class_flips:<class>` in the counts. A class's series appears at its first example, so one
             first seen on a replica that an earlier look of the step saw starts from 0 (it counted none before);
             on a replica seen for the first time, from its value, as every counter does
    values   informational: the counters' totals now, stable's interpolated p99 in seconds

`Meter.origin()` is a step's state at its start (and refuses a rollout that nothing scrapes the proxy for, or whose
model a replica under another job routes: trainserve.rollout.targets);
`Meter.look(state)` the counts since, the values, the state to keep (recorded in the history whenever it changes,
so a resumed controller counts on from it) and why the counts cannot be judged now (trainserve.rollout.targets).
State: {"le": the p99 bucket's `le` or None, "lower": the bound below, "weight": weight, "seen": {counter:
{instance: last value}}, "counts": {counter: the step's count}}.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainserve.proxy.proxy_metrics import (
    REQUEST_LATENCY,
    SHADOW_BEYOND_TOLERANCE,
    SHADOW_CLASS_FLIPS,
    SHADOW_CLASS_PAIRS,
    SHADOW_CLASSIFIED_PAIRS,
    SHADOW_FLIPS,
    SHADOW_LATENCY,
    SHADOW_PAIRS,
    SHADOW_REQUESTS,
    SHADOW_TOLERATED_PAIRS,
)
from trainserve.rollout.counting import tallied
from trainserve.rollout.prometheus import Prometheus
from trainserve.rollout.targets import PROXY_JOB, REQUESTS, proxy_targets, refuse_other_jobs, refuse_unjudged_replicas

# The statuses that are no version's error on a routed request, as trainserve:proxy_route_errors:ratio_rate5m
# reads them (monitoring/rules.yml; a test keeps the two equal): a client that gave up (CANCELLED) is nobody's.
ERRORS_EXCEPT = "OK|CANCELLED"
LATENCY, SHADOW = REQUEST_LATENCY, SHADOW_REQUESTS
QUANTILE = 0.99


def each(selector: str) -> str:
    """What one replica counted: its series summed by instance."""
    return f"sum by (instance) ({selector})"


# Counters, each read per replica ({cand} and {stable}: the two versions' selectors, {ok}: ERRORS_EXCEPT).
COUNTERS = {
    name: each(selector)
    for name, selector in {
        "canary_requests": REQUESTS + '{{{cand},route="canary"}}',
        "canary_errors": REQUESTS + '{{{cand},route="canary",status!~"{ok}"}}',
        "stable_requests": REQUESTS + '{{{stable},route="stable"}}',
        "stable_errors": REQUESTS + '{{{stable},route="stable",status!~"{ok}"}}',
        "shadow_pairs": SHADOW_PAIRS + "{{{cand}}}",
        "shadow_flips": SHADOW_FLIPS + "{{{cand}}}",
        "shadow_classified": SHADOW_CLASSIFIED_PAIRS + "{{{cand}}}",
        "shadow_tolerated": SHADOW_TOLERATED_PAIRS + "{{{cand}}}",
        "shadow_beyond": SHADOW_BEYOND_TOLERANCE + "{{{cand}}}",
        "shadow_compared": SHADOW + '{{{cand},outcome="compared"}}',
        "shadow_incomparable": SHADOW + '{{{cand},outcome="incomparable"}}',
        "shadow_errors": SHADOW + '{{{cand},outcome="error"}}',
        "shadow_dropped": SHADOW + '{{{cand},outcome="dropped_queue_full"}}',
        "shadow_shed": SHADOW + '{{{cand},outcome="shed"}}',
        "shadow_cut": SHADOW + '{{{cand},outcome="cut"}}',
    }.items()
}
# The flip matrix's rows, per replica and stable's class (counts' keys: `<name>:<class>`).
CLASS_COUNTERS = {
    "shadow_class_pairs": f"sum by (instance, class) ({SHADOW_CLASS_PAIRS}{{{{{{cand}}}}}})",
    "shadow_class_flips": f"sum by (instance, class) ({SHADOW_CLASS_FLIPS}{{{{{{cand}}}}}})",
}
# Counted once the step's threshold is known ({le}: its bucket's bound, {lower}: the bound below): each version's
# predict calls, and those above each bound (the calls counted minus that bound's bucket); and the shadow copies
# the candidate answered (`copies`: their own histogram, the same buckets), against the same threshold.
CALLS = LATENCY + '_count{{{%s},api="predict"}}'
WITHIN = LATENCY + '_bucket{{{%s},api="predict",le="{%s}"}}'
COPY_CALLS = SHADOW_LATENCY + "_count{{{%s}}}"
COPY_WITHIN = SHADOW_LATENCY + '_bucket{{{%s},le="{%s}"}}'
TIMED = (
    ("candidate", "cand", CALLS, WITHIN),
    ("stable", "stable", CALLS, WITHIN),
    ("copies", "cand", COPY_CALLS, COPY_WITHIN),
)
LATENCY_COUNTERS = {
    f"{timed}_{name}": query
    for timed, selector, calls, within in TIMED
    for name, query in {
        "latency_count": each(calls % selector),
        "above_bound": f"{each(calls % selector)} - {each(within % (selector, 'le'))}",
        "above_lower": f"{each(calls % selector)} - {each(within % (selector, 'lower'))}",
    }.items()
}
THRESHOLD = "latency_threshold_seconds"
# Look.counts: what the checks read (trainserve.rollout.analysis), every key always there.
KEYS = (*COUNTERS, *(f"{timed}_{name}" for timed, *_ in TIMED for name in ("latency_count", "slow")))
# Stable's calls by bucket over the 5 minutes before a step: its threshold (the recording rule's window).
BUCKETS = f'sum by (le) (rate({LATENCY}_bucket{{{{{{stable}},api="predict"}}}}[5m]))'


def queries(
    model: str, candidate: int, stable: int, job: str = PROXY_JOB, le: str | None = None, lower: str | None = None
) -> dict[str, str]:
    """Every PromQL query of a step, by name: the counters per replica (with `le` and `lower`, the threshold's
    bucket bounds, the latency ones too) and the threshold's buckets."""

    def selector(version: int) -> str:
        return f'job="{job}",model_name="{model}",version="{version}"'

    names = {"cand": selector(candidate), "stable": selector(stable), "ok": ERRORS_EXCEPT, "le": le, "lower": lower}
    counters = {**COUNTERS, **(LATENCY_COUNTERS if le is not None else {})}
    every_replica = f'sum by (instance) (up{{job="{job}"}} == 1) * 0'  # scraped now without the series: 0
    return {
        **{name: f"{expr.format(**names)} or {every_replica}" for name, expr in counters.items()},
        **{name: expr.format(**names) for name, expr in CLASS_COUNTERS.items()},
        THRESHOLD: BUCKETS.format(**names),
    }


def threshold(buckets: list[tuple[str, float]], quantile: float = QUANTILE) -> dict | None:
    """Where `quantile` of the cumulative `buckets` (le, count) falls, as histogram_quantile() interpolates it:
    {"le": its bucket's bound, "lower": the bound below, "weight": the share of that bucket's calls above it}.
    In the first bucket or beyond the last finite bound: that bound, weight 0 (calls above it count; beyond it
    histogram_quantile() answers that bound too). None when nothing was counted."""
    ordered = sorted(buckets, key=lambda bucket: float(bucket[0]))
    if not ordered or ordered[-1][1] <= 0:
        return None
    rank = quantile * ordered[-1][1]
    index = next(i for i, (_, count) in enumerate(ordered) if count >= rank)
    if float(ordered[index][0]) == float("inf"):
        index -= 1
        if index < 0:
            return None
    elif index > 0:
        (lower, below), (le, within) = ordered[index - 1], ordered[index]
        return {"le": le, "lower": lower, "weight": (within - rank) / (within - below)}
    return {"le": ordered[index][0], "lower": ordered[index][0], "weight": 0.0}


def threshold_seconds(limit: dict) -> float:
    """The interpolated quantile of `threshold`'s answer, in seconds (the buckets are in microseconds)."""
    le, lower = float(limit["le"]), float(limit["lower"])
    return (le - (le - lower) * limit["weight"]) / 1e6


def slow_calls(above_bound: int, above_lower: int, weight: float) -> float:
    """A version's calls above the interpolated quantile: 1 for each above the bucket's bound, `weight` for each in
    the bucket. A sum of per-call scores in [0, 1], which trainserve.stats.sequential bounds as it bounds counts."""
    return above_bound + weight * max(above_lower - above_bound, 0)


def _threshold_of(state: dict) -> dict | None:
    """The step's threshold as its state keeps it (a state from before `lower`: that bound alone, weight 0)."""
    le = state.get("le")
    return None if le is None else {"le": le, "lower": state.get("lower", le), "weight": state.get("weight", 0.0)}


OLD_NAMES = {"candidate_slow": "candidate_above_bound", "stable_slow": "stable_above_bound"}


def _renamed(kept: dict) -> dict:
    """A state's counters by today's names: before `lower`, the calls above the bound were `<version>_slow`."""
    return {OLD_NAMES.get(name, name): value for name, value in kept.items()}


@dataclass(frozen=True)
class Look:
    """One look: the step's counts (KEYS), every query's value, the state to keep, and why the counts cannot be
    judged at this look (None: they can)."""

    counts: dict[str, float]  # slow calls weighed, the rest whole
    values: dict[str, float | None]
    state: dict
    unjudged: str | None = None


class Meter:
    """The queries of one rollout (model, candidate, stable) asked of `prometheus`, the proxy scraped as `job`."""

    def __init__(self, prometheus: Prometheus, model: str, candidate: int, stable: int, job: str = PROXY_JOB):
        self.prometheus, self.model, self.job = prometheus, model, job
        self.rollout = (model, candidate, stable)
        self.queries = queries(*self.rollout, job)

    def origin(self) -> dict:
        """The state a step's counts start from: every replica's counters now, the step's latency threshold.
        Refused when Prometheus has had no target of the proxy's job for a while (nothing scrapes it), or a
        replica under another job routes the model (trainserve.rollout.targets)."""
        refuse_unjudged_replicas(self.prometheus, self.job, self.model)
        state, _ = self._counted({})
        return state

    def rebased(self, state: dict) -> dict:
        """`state` resumed after a pause: the step's counts and threshold kept, every replica's counters re-read
        as where they start again (what they counted while the route was held, stable's calls alone, is not the
        step's)."""
        fresh, _ = self._counted({key: state[key] for key in ("le", "lower", "weight") if key in state})
        return {**fresh, "counts": _renamed(state.get("counts") or {})}

    def look(self, state: dict) -> Look:
        """The step's counts from `state` on. Unjudged while a target is down or silent, before or after the
        counters are read (a replica missed in between has its calls counted at a later look). Refused when a
        replica under another job routes the model."""
        refuse_other_jobs(self.prometheus, self.job, self.model)
        before = proxy_targets(self.prometheus, self.job).unjudged()
        state, values = self._counted(state)
        after = proxy_targets(self.prometheus, self.job).unjudged()
        return Look(step_counts(state["counts"], _threshold_of(state)), values, state, after or before)

    def _counted(self, state: dict) -> tuple[dict, dict]:
        limit = _threshold_of(state)
        if limit is None:  # the step's threshold, fixed at its first look that has one
            limit = threshold([(s.get("le", ""), v) for s, v in self.prometheus.series(self.queries[THRESHOLD])])
        bounds = (limit["le"], limit["lower"]) if limit else ()
        self.queries = queries(*self.rollout, self.job, *bounds)
        seen, counts = _renamed(state.get("seen") or {}), _renamed(state.get("counts") or {})
        known = set(seen.get("shadow_classified", {}))  # the replicas an earlier look of the step saw
        values: dict[str, float | None] = {THRESHOLD: threshold_seconds(limit) if limit else None}
        for name in (*COUNTERS, *(LATENCY_COUNTERS if limit else ())):
            answer = {s.get("instance", ""): v for s, v in self.prometheus.series(self.queries[name])}
            seen[name], counts[name] = tallied(seen.get(name, {}), counts.get(name, 0), answer)
            values[name] = sum(answer.values()) if answer else None
        for name in CLASS_COUNTERS:
            values[name] = self._count_classes(name, known, seen, counts)
        return {**(limit or {"le": None}), "seen": seen, "counts": counts}, values

    def _count_classes(self, name: str, known: set, seen: dict, counts: dict) -> float | None:
        """Each class's series of counter `name` tallied as its own counter (`name:<class>`), in place; a class
        first seen on a replica in `known` (seen at an earlier look) from 0. Returns their total now."""
        by_class: dict[str, dict[str, float]] = {}
        for labels, value in self.prometheus.series(self.queries[name]):
            by_class.setdefault(labels.get("class", ""), {})[labels.get("instance", "")] = value
        for label, answer in by_class.items():
            key = f"{name}:{label}"
            last = {instance: 0 for instance in answer if instance in known} | seen.get(key, {})
            seen[key], counts[key] = tallied(last, counts.get(key, 0), answer)
        return sum(v for answer in by_class.values() for v in answer.values()) if by_class else None


def step_counts(counted: dict, limit: dict | None) -> dict[str, float]:
    """Look.counts from a step's counters (by COUNTERS' and LATENCY_COUNTERS' names) and its threshold: each
    version's slow calls, and the slow shadow copies, weighed by the threshold."""
    counts = {name: counted.get(name, 0) for name in COUNTERS}
    counts |= {name: n for name, n in counted.items() if ":" in name and name.split(":")[0] in CLASS_COUNTERS}
    for timed, *_ in TIMED:
        above = (counted.get(f"{timed}_above_bound", 0), counted.get(f"{timed}_above_lower", 0))
        counts[f"{timed}_latency_count"] = counted.get(f"{timed}_latency_count", 0)
        counts[f"{timed}_slow"] = slow_calls(*above, limit["weight"]) if limit else 0
    return counts
