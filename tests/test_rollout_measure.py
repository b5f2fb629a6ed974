"""What a rollout step counts, without a Prometheus: per-replica counting against an independent simulation of
replicas that count, restart, miss scrapes and appear late; the step's latency threshold against numpy's quantile;
why a look cannot be judged; the queries and the recording rules counting the same errors.
(Against a real Prometheus with a replica missing scrapes: test_rollout_measure_prometheus.py.)"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prometheus_server import ALERTS, RECORDS
from trainserve.rollout.counting import tallied
from trainserve.rollout.measure import ERRORS_EXCEPT, KEYS, bound_at_or_above, queries
from trainserve.rollout.targets import Targets

pytestmark = pytest.mark.unit

BOUNDS = tuple(10 * 1.8**i for i in range(33))  # the proxy's microsecond buckets

# One replica between two looks: ("inc", n) calls counted, ("reset",) a restart (its counters back to 0).
happenings = st.lists(st.one_of(st.tuples(st.just("inc"), st.integers(1, 50)), st.just(("reset",))), max_size=4)
replica = st.tuples(
    st.integers(0, 5),  # the look it is first scraped at (a replica that appears late)
    st.lists(st.tuples(happenings, st.booleans()), min_size=6, max_size=6),  # before each look; scraped at it?
)


@settings(max_examples=300, deadline=None)
@given(st.lists(replica, min_size=1, max_size=4))
def test_a_steps_count_is_the_calls_seen_between_looks_and_never_more(replicas):
    """Each replica's calls, counted from events (not values): those between two looks that scraped it, after the
    last restart in between; a replica's first look is where it starts. Resets that leave the counter at or above
    the value last seen cannot be told from calls: then fewer are counted, never more."""
    value = [0] * len(replicas)
    last_scraped: list[int | None] = [None] * len(replicas)
    since_scrape = [0] * len(replicas)  # calls since the last look that scraped it, after its last restart
    restarted = [False] * len(replicas)  # since the last look that scraped it
    all_calls = [0] * len(replicas)  # every call since it was first scraped
    hidden_resets, seen, counted, expected = False, {}, 0, 0
    for look in range(6):
        answer = {}
        for r, (first, story) in enumerate(replicas):
            happened, scraped = story[look]
            for event in happened:
                if event[0] == "inc":
                    value[r] += event[1]
                    since_scrape[r] += event[1]
                    all_calls[r] += event[1] if last_scraped[r] is not None else 0
                else:
                    value[r], since_scrape[r], restarted[r] = 0, 0, True
            if look >= first and scraped:
                if last_scraped[r] is not None:
                    expected += since_scrape[r]
                    hidden_resets |= restarted[r] and value[r] >= last_scraped[r]
                last_scraped[r], since_scrape[r], restarted[r] = value[r], 0, False
                answer[f"10.0.0.{r}:8511"] = float(value[r])
        seen, counted = tallied(seen, counted, answer)
        assert counted <= sum(all_calls), "more than the replicas counted since first seen"
        assert counted <= expected if hidden_resets else counted == expected, (counted, expected)


def test_a_replica_that_misses_a_look_adds_only_its_increase_when_back():
    seen, counted = tallied({}, 0, {"a": 100.0, "b": 20000.0})  # b: a long history before the step
    seen, counted = tallied(seen, counted, {"a": 110.0})  # b missed: nothing of it added, nothing re-based
    assert (counted, seen["b"]) == (10, 20000)
    seen, counted = tallied(seen, counted, {"a": 120.0, "b": 20050.0})
    assert counted == 70  # 10 + 10 of a, 50 of b: none of b's history
    seen, counted = tallied(seen, counted, {"a": 5.0, "b": 20060.0})  # a restarted: its 5 since
    assert counted == 85


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(1, 3e7, allow_nan=False), min_size=1, max_size=300))
def test_the_threshold_is_the_bucket_bound_at_or_above_the_p99(micros):
    """Against numpy: the smallest call at or above 99 % of them (the inverted CDF), then the first bound at or
    above it; above the last finite bound, that bound (as histogram_quantile answers)."""
    observed = np.array(micros)
    edges = (*BOUNDS, math.inf)
    buckets = [("+Inf" if b == math.inf else f"{b:g}", float(np.sum(observed <= b))) for b in edges]
    p99 = np.quantile(observed, 0.99, method="inverted_cdf")
    bound = next((b for b in BOUNDS if b >= p99), BOUNDS[-1])
    assert bound_at_or_above(buckets) == f"{bound:g}"


def test_no_threshold_before_stable_has_calls():
    assert bound_at_or_above([]) is None
    assert bound_at_or_above([("10", 0.0), ("+Inf", 0.0)]) is None


@pytest.mark.parametrize(
    ("targets", "said"),
    [
        pytest.param(Targets({"a:1": True, "b:1": True}), None, id="all-counting"),
        pytest.param(Targets({}), "no target of scrape job 'proxy' in Prometheus now", id="none"),
        pytest.param(Targets({"a:1": True, "b:1": False}), "proxy targets down (scrape job 'proxy'): b:1", id="down"),
        pytest.param(
            Targets({"a:1": True, "c:1": False, "b:1": False}, "proxy", frozenset({"a:1"})),
            "proxy targets down (scrape job 'proxy'): b:1, c:1; proxy targets up without request counts "
            "(scrape job 'proxy'): a:1",
            id="down-and-silent",
        ),
    ],
)
def test_a_look_is_unjudged_while_a_target_is_down_or_silent_and_says_which(targets, said):
    found = targets.unjudged()
    assert found == said if said is None else found.startswith(said), found


def test_the_errors_counted_are_the_route_records_and_the_canary_alerts():
    rule = RECORDS["trainserve:proxy_route_errors:ratio_rate5m"]
    assert f'status!~"{ERRORS_EXCEPT}"' in rule, rule
    assert "trainserve:proxy_route_errors:ratio_rate5m" in ALERTS["TrainserveCanaryErrorRatio"]["expr"]


def test_the_queries_read_both_versions_from_the_same_counters_per_replica():
    found = queries("m", 7, 3, "proxy", le="6428.06")
    every = ' or sum by (instance) (up{job="proxy"} == 1) * 0'
    cand, stable = 'job="proxy",model_name="m",version="7"', 'job="proxy",model_name="m",version="3"'
    assert found["canary_errors"] == (
        f'sum by (instance) (:trainserve:proxy:request_count{{{cand},route="canary",status!~"OK|CANCELLED"}})' + every
    )
    assert found["stable_errors"] == found["canary_errors"].replace(cand, stable).replace("canary", "stable")
    slow = found["candidate_slow"]
    assert f':trainserve:proxy:request_latency_bucket{{{cand},api="predict",le="6428.06"}}' in slow
    assert set(KEYS) <= set(found) and "candidate_slow" not in queries("m", 7, 3)  # no threshold: not asked yet
    assert found["stable_error_ratio"] == f'max(trainserve:proxy_route_errors:ratio_rate5m{{{stable},route="stable"}})'
