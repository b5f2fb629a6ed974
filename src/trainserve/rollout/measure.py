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
    latency  each version's predict calls, and those above the step's threshold: the histogram's bucket bound at
             or above stable's p99 over the 5 minutes before the step began, fixed for the step and kept in its
             state (a step that begins before stable has a p99 fixes it at its first look that has one, and counts
             both versions' latency from there)
    values   informational: the counters' totals now, the recording rules' route error ratios and p99s, the
             threshold in seconds

`Meter.origin()` is a step's state at its start (and refuses a rollout that nothing scrapes the proxy for);
`Meter.look(state)` the counts since, the values, the state to keep (recorded in the history whenever it changes,
so a resumed controller counts on from it) and why the counts cannot be judged now (trainserve.rollout.targets).
State: {"le": the threshold bucket's `le` or None, "seen": {counter: {instance: last value}}, "counts": {counter:
the step's count}}.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainserve.proxy.proxy_metrics import (
    REQUEST_LATENCY,
    SHADOW_CLASSIFIED_PAIRS,
    SHADOW_FLIPS,
    SHADOW_PAIRS,
    SHADOW_REQUESTS,
)
from trainserve.rollout.counting import tallied
from trainserve.rollout.prometheus import Prometheus
from trainserve.rollout.targets import PROXY_JOB, REQUESTS, proxy_targets, refuse_if_never_scraped

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
        "shadow_compared": SHADOW + '{{{cand},outcome="compared"}}',
        "shadow_incomparable": SHADOW + '{{{cand},outcome="incomparable"}}',
        "shadow_errors": SHADOW + '{{{cand},outcome="error"}}',
        "shadow_dropped": SHADOW + '{{{cand},outcome="dropped_queue_full"}}',
        "shadow_shed": SHADOW + '{{{cand},outcome="shed"}}',
        "shadow_cut": SHADOW + '{{{cand},outcome="cut"}}',
    }.items()
}
# Counted once the step's threshold ({le}) is known: each version's predict calls, and those above the threshold
# (the calls counted minus the threshold bucket's).
CALLS = LATENCY + '_count{{{%s},api="predict"}}'
WITHIN = LATENCY + '_bucket{{{%s},api="predict",le="{le}"}}'
LATENCY_COUNTERS = {
    "candidate_latency_count": each(CALLS % "cand"),
    "candidate_slow": f"{each(CALLS % 'cand')} - {each(WITHIN % 'cand')}",
    "stable_latency_count": each(CALLS % "stable"),
    "stable_slow": f"{each(CALLS % 'stable')} - {each(WITHIN % 'stable')}",
}
RATIOS = {
    "candidate_error_ratio": 'trainserve:proxy_route_errors:ratio_rate5m{{{cand},route="canary"}}',
    "stable_error_ratio": 'trainserve:proxy_route_errors:ratio_rate5m{{{stable},route="stable"}}',
    "candidate_p99_seconds": "trainserve:proxy_latency_seconds:p99_rate5m{{{cand}}}",
    "stable_p99_seconds": "trainserve:proxy_latency_seconds:p99_rate5m{{{stable}}}",
}
THRESHOLD = "latency_threshold_seconds"
# Look.counts: what the checks read (trainserve.rollout.analysis), every key always there.
KEYS = (*COUNTERS, *LATENCY_COUNTERS)
# Stable's calls by bucket over the 5 minutes before a step: its threshold (the recording rule's window).
BUCKETS = f'sum by (le) (rate({LATENCY}_bucket{{{{{{stable}},api="predict"}}}}[5m]))'


def queries(model: str, candidate: int, stable: int, job: str = PROXY_JOB, le: str | None = None) -> dict[str, str]:
    """Every PromQL query of a step, by name: the counters per replica (with `le`, the latency ones too), the
    threshold's buckets, the ratios as `max(...)` (one series each)."""

    def selector(version: int) -> str:
        return f'job="{job}",model_name="{model}",version="{version}"'

    names = {"cand": selector(candidate), "stable": selector(stable), "ok": ERRORS_EXCEPT, "le": le}
    counters = {**COUNTERS, **(LATENCY_COUNTERS if le is not None else {})}
    every_replica = f'sum by (instance) (up{{job="{job}"}} == 1) * 0'  # scraped now without the series: 0
    return {
        **{name: f"{expr.format(**names)} or {every_replica}" for name, expr in counters.items()},
        THRESHOLD: BUCKETS.format(**names),
        **{name: f"max({expr.format(**names)})" for name, expr in RATIOS.items()},
    }


def bound_at_or_above(buckets: list[tuple[str, float]], quantile: float = QUANTILE) -> str | None:
    """The `le` of the bucket in which `quantile` of the cumulative `buckets` (le, count) falls: the bucket
    histogram_quantile() interpolates in, so its bound is at or above that quantile (beyond the last finite bound:
    that bound, as histogram_quantile() answers). None when nothing was counted."""
    ordered = sorted(buckets, key=lambda bucket: float(bucket[0]))
    if not ordered or ordered[-1][1] <= 0:
        return None
    rank = quantile * ordered[-1][1]
    index = next(i for i, (_, count) in enumerate(ordered) if count >= rank)
    if float(ordered[index][0]) == float("inf"):
        index -= 1
    return ordered[index][0] if index >= 0 else None


@dataclass(frozen=True)
class Look:
    """One look: the step's counts (KEYS), every query's value, the state to keep, and why the counts cannot be
    judged at this look (None: they can)."""

    counts: dict[str, int]
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
        Refused when Prometheus has had no target of the proxy's job for a while (nothing scrapes it)."""
        if not proxy_targets(self.prometheus, self.job).up:
            refuse_if_never_scraped(self.prometheus, self.job)
        state, _ = self._counted({})
        return state

    def look(self, state: dict) -> Look:
        """The step's counts from `state` on. Unjudged while a target is down or silent, before or after the
        counters are read (a replica missed in between has its calls counted at a later look)."""
        before = proxy_targets(self.prometheus, self.job).unjudged()
        state, values = self._counted(state)
        values.update({name: self.prometheus.value(self.queries[name]) for name in RATIOS})
        after = proxy_targets(self.prometheus, self.job).unjudged()
        counts = {name: state["counts"].get(name, 0) for name in KEYS}
        return Look(counts, values, state, after or before)

    def _counted(self, state: dict) -> tuple[dict, dict]:
        le = state.get("le")
        if le is None:  # the step's threshold, fixed at its first look that has one
            le = bound_at_or_above([(s.get("le", ""), v) for s, v in self.prometheus.series(self.queries[THRESHOLD])])
        self.queries = queries(*self.rollout, self.job, le)
        seen, counts = dict(state.get("seen") or {}), dict(state.get("counts") or {})
        values: dict[str, float | None] = {THRESHOLD: None if le is None else float(le) / 1e6}
        for name in (*COUNTERS, *(LATENCY_COUNTERS if le is not None else ())):
            answer = {s.get("instance", ""): v for s, v in self.prometheus.series(self.queries[name])}
            seen[name], counts[name] = tallied(seen.get(name, {}), counts.get(name, 0), answer)
            values[name] = sum(answer.values()) if answer else None
        return {"le": le, "seen": seen, "counts": counts}, values
