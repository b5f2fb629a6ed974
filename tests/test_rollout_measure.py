"""What a rollout step counts, without a Prometheus: per-replica counting against an independent simulation of
replicas that count, restart, miss scrapes and appear late; the step's latency threshold against numpy's quantile
and Prometheus' histogram_quantile(), and the slow calls it weighs against the calls above the true p99; why a look
cannot be judged; the queries and the recording rules counting the same errors.
(Against a real Prometheus with a replica missing scrapes: test_rollout_measure_prometheus.py.)"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prometheus_server import ALERTS, RECORDS
from trainserve.rollout.counting import tallied
from trainserve.rollout.measure import (
    COUNTERS,
    ERRORS_EXCEPT,
    KEYS,
    LATENCY_COUNTERS,
    THRESHOLD,
    Meter,
    queries,
    slow_calls,
    step_counts,
    threshold,
    threshold_seconds,
)
from trainserve.rollout.targets import Targets

BOUNDS = tuple(10 * 1.8**i for i in range(33))  # the proxy's microsecond buckets

# One replica between two looks: ("inc", n) calls counted, ("reset",) a restart (its counters back to 0).
happenings = st.lists(st.one_of(st.tuples(st.just("inc"), st.integers(1, 50)), st.just(("reset",))), max_size=4)
replica = st.tuples(
    st.integers(0, 5),  # the look it is first scraped at (a replica that appears late)
    st.lists(st.tuples(happenings, st.booleans()), min_size=6, max_size=6),  # before each look; scraped at it?
)


@pytest.mark.integration
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


@pytest.mark.unit
def test_a_replica_that_misses_a_look_adds_only_its_increase_when_back():
    seen, counted = tallied({}, 0, {"a": 100.0, "b": 20000.0})  # b: a long history before the step
    seen, counted = tallied(seen, counted, {"a": 110.0})  # b missed: nothing of it added, nothing re-based
    assert (counted, seen["b"]) == (10, 20000)
    seen, counted = tallied(seen, counted, {"a": 120.0, "b": 20050.0})
    assert counted == 70  # 10 + 10 of a, 50 of b: none of b's history
    seen, counted = tallied(seen, counted, {"a": 5.0, "b": 20060.0})  # a restarted: its 5 since
    assert counted == 85


def cumulative(micros: np.ndarray) -> list[tuple[str, float]]:
    """The calls as the proxy's histogram exports them: (le, calls at or under it), +Inf last."""
    edges = (*BOUNDS, math.inf)
    return [("+Inf" if b == math.inf else f"{b:g}", float(np.sum(micros <= b))) for b in edges]


def histogram_quantile(q: float, buckets: list[tuple[str, float]]) -> float:
    """Prometheus' bucketQuantile (promql/quantile.go), written again: linear within the bucket the rank falls in,
    from 0 in the first; in +Inf, the last finite bound."""
    bounds, counts = [float(le) for le, _ in buckets], [c for _, c in buckets]
    rank = q * counts[-1]
    b = next(i for i, c in enumerate(counts) if c >= rank)
    if b == len(bounds) - 1:
        return bounds[-2]
    start, below = (0.0, 0.0) if b == 0 else (bounds[b - 1], counts[b - 1])
    return start + (bounds[b] - start) * (rank - below) / (counts[b] - below)


@pytest.mark.unit
@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(1, 3e7, allow_nan=False), min_size=1, max_size=300))
def test_the_threshold_is_in_the_bucket_of_the_p99(micros):
    """Against numpy: the smallest call at or above 99 % of them (the inverted CDF), then the first bound at or
    above it; above the last finite bound, that bound (as histogram_quantile answers)."""
    observed = np.array(micros)
    p99 = np.quantile(observed, 0.99, method="inverted_cdf")
    bound = next((b for b in BOUNDS if b >= p99), BOUNDS[-1])
    assert threshold(cumulative(observed))["le"] == f"{bound:g}"


@pytest.mark.unit
@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(11, 3e7, allow_nan=False), min_size=1, max_size=300))
def test_the_threshold_is_the_dashboards_p99_and_stables_own_slow_calls_are_1_percent(micros):
    """Its p99 is histogram_quantile()'s (beyond the first bucket); the calls it was taken from, weighed as a step
    weighs them, are 1 % slow wherever the p99 falls in its bucket (the bound above it alone counted 0.02-1 %)."""
    buckets = cumulative(np.array(micros))
    found = threshold(buckets)
    assert threshold_seconds(found) * 1e6 == pytest.approx(histogram_quantile(0.99, buckets), rel=1e-9)
    count = dict(buckets)
    above = (count["+Inf"] - count[found["le"]], count["+Inf"] - count[found["lower"]])
    if found["weight"]:  # (0: the p99 beyond the last finite bound, where every call above it counts)
        assert slow_calls(*above, found["weight"]) == pytest.approx(0.01 * len(micros), abs=1e-9)


@pytest.mark.unit
def test_a_candidate_twice_as_slow_counts_its_calls_above_stables_p99_wherever_it_falls():
    """Stable's p99 just above a bound puts the next bound 1.76x above it, where a candidate twice as slow had
    only 2 % of its calls, a point over stable's: too few for a 5 % step to show. Weighed, its slow share is its
    share above stable's true p99 (17 %), within the bucket's linear approximation."""
    rng = np.random.default_rng(0)
    z99 = 2.3263478740408408  # the standard normal's 99th percentile
    median = BOUNDS[14] * 1.02 / math.exp(0.5 * z99)  # stable's p99 2 % above the 15th bound
    stable = rng.lognormal(math.log(median), 0.5, 200_000)
    found = threshold(cumulative(stable))
    assert float(found["le"]) / np.quantile(stable, 0.99) == pytest.approx(1.8 / 1.02, rel=0.01)
    for calls, share in ((stable, 0.01), (2 * stable, np.mean(2 * stable > np.quantile(stable, 0.99)))):
        count = dict(cumulative(calls))
        above = (count["+Inf"] - count[found["le"]], count["+Inf"] - count[found["lower"]])
        assert slow_calls(*above, found["weight"]) / len(calls) == pytest.approx(share, abs=0.015)
    assert share > 0.15


@pytest.mark.unit
def test_no_threshold_before_stable_has_calls():
    assert threshold([]) is None
    assert threshold([("10", 0.0), ("+Inf", 0.0)]) is None


@pytest.mark.unit
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


@pytest.mark.unit
def test_the_errors_counted_are_the_route_records_and_the_canary_alerts():
    rule = RECORDS["trainserve:proxy_route_errors:ratio_rate5m"]
    assert f'status!~"{ERRORS_EXCEPT}"' in rule, rule
    assert "trainserve:proxy_route_errors:ratio_rate5m" in ALERTS["TrainserveCanaryErrorRatio"]["expr"]


@pytest.mark.unit
def test_the_queries_read_both_versions_from_the_same_counters_per_replica():
    found = queries("m", 7, 3, "proxy", le="6428.06", lower="3571.14")
    every = ' or sum by (instance) (up{job="proxy"} == 1) * 0'
    cand, stable = 'job="proxy",model_name="m",version="7"', 'job="proxy",model_name="m",version="3"'
    assert found["canary_errors"] == (
        f'sum by (instance) (:trainserve:proxy:request_count{{{cand},route="canary",status!~"OK|CANCELLED"}})' + every
    )
    assert found["stable_errors"] == found["canary_errors"].replace(cand, stable).replace("canary", "stable")
    slow = found["candidate_above_bound"], found["candidate_above_lower"]
    assert f':trainserve:proxy:request_latency_bucket{{{cand},api="predict",le="6428.06"}}' in slow[0]
    assert f':trainserve:proxy:request_latency_bucket{{{cand},api="predict",le="3571.14"}}' in slow[1]
    assert "candidate_above_bound" not in queries("m", 7, 3)  # no threshold: not asked yet
    # every look asks what the counts are made of, and nothing else (no ratios that no check reads)
    assert set(found) == {*COUNTERS, *LATENCY_COUNTERS, THRESHOLD}
    assert set(step_counts(dict.fromkeys(found, 0), {"le": "6428.06", "lower": "3571.14", "weight": 0.5})) == set(KEYS)


class Answers:
    """A Prometheus that answers a Meter's queries by name: one replica "a" up, each counter's value there."""

    def __init__(self, buckets: list[tuple[str, float]], **values: float):
        self.meter: Meter | None = None
        self.buckets, self.values = buckets, values

    def series(self, expr: str) -> list[tuple[dict[str, str], float]]:
        if expr.startswith("up{"):
            return [({"instance": "a"}, 1.0)]
        name = next((n for n, q in self.meter.queries.items() if q == expr), None)
        if name == THRESHOLD:
            return [({"le": le}, count) for le, count in self.buckets]
        return [({"instance": "a"}, float(self.values.get(name, 0)))] if name else []


def looked(answers: Answers, state: dict | None = None):
    meter = Meter(answers, "m", 7, 3)
    answers.meter = meter
    return meter, meter.look(state) if state is not None else meter.origin()


@pytest.mark.unit
def test_a_look_weighs_each_versions_calls_in_the_p99_bucket_by_its_share_above_the_p99():
    # stable's last 5 minutes: 96 calls under 1984.2 us, 4 in (1984.2, 3571.56]: its p99 3/4 into that bucket
    buckets = [("1102.34", 50.0), ("1984.2", 96.0), ("3571.56", 100.0), ("+Inf", 100.0)]
    _, origin = looked(Answers(buckets))
    assert (origin["le"], origin["lower"], origin["weight"]) == ("3571.56", "1984.2", pytest.approx(0.25))
    calls = {"candidate_latency_count": 400, "candidate_above_bound": 30, "candidate_above_lower": 70}
    _, look = looked(Answers(buckets, **calls, stable_latency_count=1000, stable_above_lower=40), origin)
    assert look.counts["candidate_slow"] == pytest.approx(30 + 0.25 * 40)
    assert look.counts["stable_slow"] == pytest.approx(0.25 * 40)
    assert look.values[THRESHOLD] == pytest.approx((1984.2 + 0.75 * (3571.56 - 1984.2)) / 1e6)


@pytest.mark.unit
def test_a_step_an_older_controller_kept_counts_on_from_its_calls_above_the_bound():
    # its state: the bound alone, the calls above it named <version>_slow, with the replica's values last seen
    kept = {"candidate_slow": 5, "candidate_latency_count": 50}
    seen = {"candidate_slow": {"a": 105}, "candidate_latency_count": {"a": 1050}}
    state = {"le": "3571.56", "seen": seen, "counts": kept}
    calls = {"candidate_latency_count": 1100, "candidate_above_bound": 110, "candidate_above_lower": 500}
    _, look = looked(Answers([], **calls), state)
    assert (look.counts["candidate_latency_count"], look.counts["candidate_slow"]) == (100, 10)  # weight 0
