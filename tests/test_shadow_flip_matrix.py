"""The proxy's per-class flips and its regression tolerance count (issue 55, shadow verdicts for every model):
the flip matrix's rows by stable's class on the page, each class's two series together; a copy compared against the
route's shadow_tolerance counts the examples beyond it, and a route without one counts none."""

from __future__ import annotations

import threading
from collections import Counter

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_routing_shadow import Serving, counting, response, run_shadow, stable_request, waited

from trainserve.proxy.proxy_metrics import ProxyMetrics
from trainserve.proxy.routing import ModelRoute, Routing, RoutingError, parse_routing
from trainserve.proxy.shadow import Shadow
from trainserve.proxy.shadow_compare import Comparison

pytestmark = pytest.mark.unit


def families(metrics: ProxyMetrics) -> dict:
    return {f.name: f for f in text_string_to_metric_families("\n".join(metrics.lines()) + "\n")}


def by_class(found: dict, name: str) -> dict[str, float]:
    return {s.labels["class"]: s.value for s in found[f":trainserve:proxy:shadow_class_{name}"].samples}


def test_the_page_exports_the_flip_matrix_rows_by_stables_class():
    metrics = ProxyMetrics()
    first = Comparison(4, 4, 1, 0.0, Counter({"0": 3, "7": 1}), Counter({"7": 1}))
    metrics.compared("m", 2, first, 10.0)
    metrics.compared("m", 2, Comparison(2, 2, 2, 0.0, Counter({"other": 2}), Counter({"other": 2})), 10.0)
    found = families(metrics)
    assert by_class(found, "pairs") == {"0": 3, "7": 1, "other": 2}
    assert by_class(found, "flips") == {"0": 0, "7": 1, "other": 2}  # a class's flips series beside its pairs
    sample = found[":trainserve:proxy:shadow_class_flips"].samples[0]
    assert set(sample.labels) == {"model_name", "version", "class"}
    assert (
        ":trainserve:proxy:shadow_tolerated_pairs" not in found
        or not found[":trainserve:proxy:shadow_tolerated_pairs"].samples
    )


def test_the_page_exports_the_examples_beyond_the_tolerance():
    metrics = ProxyMetrics()
    metrics.compared("m", 2, Comparison(3, 0, 0, 1.0, tolerated=3, beyond=1), 10.0)
    metrics.compared("m", 2, Comparison(5, 0, 0, 1.0, tolerated=5, beyond=0), 10.0)
    found = families(metrics)
    for name, value in (("tolerated_pairs", 8), ("beyond_tolerance", 1)):
        (sample,) = found[f":trainserve:proxy:shadow_{name}"].samples
        assert sample.labels == {"model_name": "m", "version": "2"} and sample.value == value


class Routed:
    """What Shadow reads of the proxy's router: the routing in force."""

    def __init__(self, routing: Routing):
        self.routing = routing


@pytest.mark.parametrize("tolerance, beyond", [(0.5, 1), (None, None)])
def test_a_copy_is_compared_against_the_routes_tolerance(tolerance, beyond):
    stable_answer = response(1, np.array([[1.0], [2.0]], np.float32), name="predictions")
    candidate = response(2, np.array([[1.2], [2.9]], np.float32), name="predictions")  # 0.2 within, 0.9 beyond
    upstream = Serving(hold_candidate=False, candidate_answer=candidate)
    done = threading.Event()

    async def one_copy(shadow: Shadow) -> None:
        shadow.metrics.router = Routed(Routing({"m": ModelRoute(2, 100, 0, shadow_tolerance=tolerance)}))
        shadow.metrics.compared = counting(shadow.metrics.compared, 1, done)
        shadow.offer("m", 2, stable_request().SerializeToString(), stable_answer.SerializeToString(), ())
        assert await waited(done)

    try:
        metrics = run_shadow(upstream, one_copy)
    finally:
        upstream.stop()
    assert metrics.tolerated.get(("m", "2")) == (2 if tolerance is not None else None)
    assert metrics.beyond.get(("m", "2")) == beyond


def test_the_routing_file_carries_a_tolerance_and_refuses_a_bad_one():
    text = '{"schema": "trainserve.routing/1", "models": {"m": {"candidate": 2, "shadow_tolerance": %s}}}'
    assert parse_routing(text % "0.75").route("m").shadow_tolerance == 0.75
    assert "shadow_tolerance" not in Routing({"m": ModelRoute(2)}).to_json()["models"]["m"]
    for bad in ("-1", '"wide"', "true"):
        with pytest.raises(RoutingError, match="shadow_tolerance .*: expected a finite number, 0 or more"):
            parse_routing(text % bad)
