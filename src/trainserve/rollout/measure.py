"""What a rollout step has seen, from the capture proxy's series in Prometheus: the queries, a step's counts, and
whether they can be trusted at this look.

    counts   the proxy's counters summed over its replicas; a step's count is the difference from the sum when the
             step began (kept in the history as the step's state), exact where `increase()` would extrapolate, so a
             decision rests on the requests and pairs actually seen
    ratios   trainserve:proxy_errors:ratio_rate5m and trainserve:proxy_latency_seconds:p99_rate5m, the candidate's
             against stable's

`Meter.origin()` is a step's state at its start; `Meter.look(state)` the counts since, the values, and the state to
keep (recorded in the history whenever it changes, so a resumed controller counts on from it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from trainserve.rollout.prometheus import Prometheus

log = logging.getLogger(__name__)

# The statuses that are not the server's fault, as trainserve:proxy_errors:ratio_rate5m reads them
# (monitoring/rules.yml; a test keeps the two equal).
NOT_SERVER_ERRORS = "OK|INVALID_ARGUMENT|NOT_FOUND|CANCELLED"
ADVANCE, ROLLBACK, HOLD, WATCH = "advance", "rollback", "hold", "watch"
# Counters, summed over the proxy's replicas (a step's count: now minus the sum at the step's start).
COUNTERS = {
    "candidate_requests": ':trainserve:proxy:request_count{{{cand},route="canary"}}',  # its share of `stable`
    "candidate_errors": ':trainserve:proxy:request_count{{{cand},route="canary",status!~"{ok}"}}',
    "shadow_pairs": ":trainserve:proxy:shadow_pairs{{{cand}}}",
    "shadow_flips": ":trainserve:proxy:shadow_flips{{{cand}}}",
    "shadow_compared": ':trainserve:proxy:shadow_requests{{{cand},outcome="compared"}}',
    "shadow_errors": ':trainserve:proxy:shadow_requests{{{cand},outcome="error"}}',
    "shadow_dropped": ':trainserve:proxy:shadow_requests{{{cand},outcome="dropped_queue_full"}}',
}
RATIOS = {
    "candidate_error_ratio": "trainserve:proxy_errors:ratio_rate5m{{{cand}}}",
    "stable_error_ratio": "trainserve:proxy_errors:ratio_rate5m{{{stable}}}",
    "candidate_p99_seconds": "trainserve:proxy_latency_seconds:p99_rate5m{{{cand}}}",
    "stable_p99_seconds": "trainserve:proxy_latency_seconds:p99_rate5m{{{stable}}}",
}


def queries(model: str, candidate: int, stable: int) -> dict[str, str]:
    """Every PromQL query of a check, by name: counters as `sum(...)`, ratios as `max(...)` (one series each)."""

    def selector(version: int) -> str:
        return f'model_name="{model}",version="{version}"'

    names = {"cand": selector(candidate), "stable": selector(stable), "ok": NOT_SERVER_ERRORS}
    return {
        **{name: f"sum({expr.format(**names)})" for name, expr in COUNTERS.items()},
        **{name: f"max({expr.format(**names)})" for name, expr in RATIOS.items()},
    }


def step_counts(now: dict[str, float | None], start: dict[str, float]) -> dict[str, int]:
    """Each counter's count during the step. A sum below the step's start means a proxy restarted (its counters
    began again at 0): the step's count restarts from there, so it is never negative (the caller re-bases)."""
    return {name: int(round((now.get(name) or 0.0) - start.get(name, 0.0))) for name in COUNTERS}


def reset(now: dict[str, float | None], start: dict[str, float]) -> bool:
    return any((now.get(name) or 0.0) < start.get(name, 0.0) for name in COUNTERS)


@dataclass(frozen=True)
class Look:
    """One look: the step's counts, every query's value, the state to keep, and why the counts cannot be judged at
    this look (None: they can)."""

    counts: dict[str, int]
    values: dict[str, float | None]
    state: dict
    unjudged: str | None = None


class Meter:
    """The queries of one rollout (model, candidate, stable) asked of `prometheus`."""

    def __init__(self, prometheus: Prometheus, model: str, candidate: int, stable: int):
        self.prometheus, self.model = prometheus, model
        self.queries = queries(model, candidate, stable)

    def origin(self) -> dict:
        """The state a step's counts start from: the counters now."""
        return {name: self.prometheus.value(self.queries[name]) or 0.0 for name in COUNTERS}

    def look(self, state: dict) -> Look:
        values = {name: self.prometheus.value(expr) for name, expr in self.queries.items()}
        if reset(values, state):
            state = {name: values.get(name) or 0.0 for name in COUNTERS}
            log.warning("model %s: the proxy's counters went back (a restart): counting again from here", self.model)
        return Look(step_counts(values, state), values, state)
