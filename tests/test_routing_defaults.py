"""What the proxy does by default where the routing file says nothing, in front of a real serve-local (stable = 1,
candidate 2, and 3 the highest version): a request for a routed model naming neither a version nor a label is a
`stable` request (gRPC Predict, Classify, Regress, and REST), not TF Serving's highest version; REST-only clients
are counted by the version their label names, learned off the request's path (a routed model's `stable` once the
routing loads, labels in use refreshed by a background thread); a proxy started on a bad routing file starts with no
routing and says so; a candidate beyond int64 is refused and the shadow keeps working."""

from __future__ import annotations

import json
import logging
import random
import threading
from concurrent import futures

import grpc
import pytest
from routing_fixtures import SEED, answered_by, page, proxy_starter, requests, rest_predict, route, serve_three_versions

from trainserve.protos import model_pb2
from trainserve.proxy.config import ProxyConfig
from trainserve.proxy.labels import LabelVersions
from trainserve.proxy.routing import SCHEMA, ModelRoute, Routing, write_routing
from trainserve.proxy.server import Proxy
from trainserve.proxy.wire import request_spec
from trainserve.traffic.records import length_delimited


@pytest.fixture(scope="module")
def three_versions(model_versions, tmp_path_factory):
    server = serve_three_versions(model_versions, tmp_path_factory.mktemp("defaults"))
    yield server
    assert server.stop() == 0


@pytest.fixture
def proxy_for(three_versions, tmp_path):
    proxies = []
    yield proxy_starter(three_versions, tmp_path, proxies)
    for proxy in proxies:
        proxy.stop(5)


@pytest.mark.integration
def test_version_less_grpc_requests_of_a_routed_model_are_stable_requests(proxy_for, three_versions):
    proxy = proxy_for(Routing({"other": ModelRoute(9)}))
    assert answered_by(proxy, 2, label=None) == [3, 3], "a model not routed: TF Serving's highest version"
    write_routing(proxy.config.routing_file, route(shadow=100))
    assert proxy.router.poll()
    assert answered_by(proxy, 4, label=None) == [1] * 4, "stable answers, not the highest version"
    compared = ':trainserve:proxy:shadow_requests{model_name="m",version="2",outcome="compared"}'
    three_versions.wait_for(lambda: page(proxy).get(compared) == 4, "the version-less requests shadowed")
    write_routing(proxy.config.routing_file, route(canary=100))
    assert proxy.router.poll()
    assert answered_by(proxy, 3, label=None) == [2] * 3, "the canary share applies to them too"
    counts = page(proxy)
    assert requests(counts, route="direct", version="3") == 2
    assert requests(counts, route="stable", version="1", status="OK") == 4
    assert requests(counts, route="canary", version="2", status="OK") == 3


@pytest.mark.unit
def test_version_less_rest_requests_of_a_routed_model_are_stable_requests(proxy_for, three_versions):
    proxy = proxy_for(route(canary=0))
    via = f"http://127.0.0.1:{proxy.rest_port}"
    stable = rest_predict(three_versions.rest, "/v1/models/m/versions/1:predict")
    candidate = rest_predict(three_versions.rest, "/v1/models/m/versions/2:predict")
    assert stable != candidate
    assert rest_predict(via, "/v1/models/m:predict") == stable
    write_routing(proxy.config.routing_file, route(canary=100))
    assert proxy.router.poll()
    assert rest_predict(via, "/v1/models/m:predict") == candidate
    counts = page(proxy)
    assert requests(counts, route="stable", version="1", api="predict", status="OK") == 1
    assert requests(counts, route="canary", version="2", api="predict", status="OK") == 1


@pytest.mark.unit
def test_rest_only_clients_are_counted_by_the_version_their_label_names(proxy_for):
    n, percent = 60, 25
    proxy = proxy_for(route(canary=percent))
    via = f"http://127.0.0.1:{proxy.rest_port}"
    statuses = [rest_predict(via, "/v1/models/m/labels/stable:predict")[0] for _ in range(n)]
    assert statuses == [200] * n
    draws = random.Random(SEED)
    k = sum(draws.random() * 100 < percent for _ in range(n))  # one draw per stable request, none for the shadow
    counts = page(proxy)
    assert requests(counts, route="canary", version="2", status="OK") == k
    assert requests(counts, route="stable", version="1", status="OK") == n - k, "stable's REST requests by version"
    assert requests(counts, version="") == 0
    assert not proxy.metrics.label_versions, "learned without a gRPC answer"


@pytest.mark.unit
def test_a_routed_models_rest_calls_never_wait_for_the_label_lookup(proxy_for, three_versions):
    proxy = proxy_for(route(canary=0))
    labels, asked, refreshed = proxy.rest.labels, [], threading.Event()
    ask = labels.ask

    def recorded(model: str, label: str) -> str | None:
        version = ask(model, label)
        asked.append((threading.current_thread().name, model, label, version))
        if threading.current_thread().name == "proxy-labels" and version == "1":
            refreshed.set()
        return version

    labels.ask = recorded
    assert refreshed.wait(30), f"the routed model's `stable` was not learned off the request's path: {asked}"
    via = f"http://127.0.0.1:{proxy.rest_port}"
    for path in ("/v1/models/m/labels/stable:predict", "/v1/models/m:predict"):  # the second is sent as stable
        assert rest_predict(via, path)[0] == 200
    assert {thread for thread, *_ in asked} == {"proxy-labels"}, f"a request asked itself: {asked}"
    assert requests(page(proxy), route="stable", version="1", status="OK") == 2


@pytest.mark.unit
def test_label_versions_in_use_are_asked_again_off_the_requests_path():
    answers, asked, now = {("m", "stable"): "1", ("r", "stable"): "7"}, [], [0.0]
    labels = LabelVersions(
        lambda model, label: asked.append((model, label)) or answers[model, label],
        max_age_s=1.0,
        clock=lambda: now[0],
        wanted=lambda: [("r", "stable")],  # a routed model
    )

    def inline(model: str) -> tuple[str | None, list]:
        """What a request counts with, and what it asked itself."""
        before = len(asked)
        return labels.version(model, "stable"), asked[before:]

    labels.refresh()  # the routing loaded: r's `stable` is known before its first call
    assert inline("r") == ("7", [])
    assert inline("m") == ("1", [("m", "stable")])  # never asked before: the first call asks
    now[0] = 0.5
    labels.refresh()  # m was counted since the last pass: asked again
    answers["m", "stable"] = "3"  # the label moves
    now[0] = 1.4
    assert inline("m") == ("1", [])  # the pass's answer is 0.9 s old: still within max_age
    labels.refresh()
    assert inline("m") == ("3", [])  # the moved label learned by the pass, not by a request
    assert asked.count(("r", "stable")) == 3, "a routed model's `stable` at every pass"
    now[0] = 1.9
    labels.refresh()  # m counted since: asked again at 1.9
    now[0] = 2.4
    labels.refresh()  # m not counted since 1.9: left to go stale
    now[0] = 3.0
    answers["m", "stable"] = "4"
    assert inline("m") == ("4", [("m", "stable")]), "an answer older than max_age is never counted with"


@pytest.mark.unit
def test_a_proxy_started_on_a_bad_routing_file_routes_nothing_then_follows_the_fixed_file(proxy_for, tmp_path, caplog):
    path = tmp_path / "routing.json"
    path.write_text(json.dumps({"schema": SCHEMA, "models": {"m": {"candidate": 2, "canary_percent": -1}}}))
    with caplog.at_level(logging.ERROR, logger="trainserve.proxy.router"):
        proxy = proxy_for()
        assert not proxy.router.poll(), "the same bad file is not refused twice"
    assert len(caplog.records) == 1 and "\n" not in caplog.records[0].getMessage(), caplog.text
    assert "canary_percent -1: expected a percentage between 0 and 100" in caplog.text
    assert proxy.router.routing == Routing()
    assert page(proxy)[":trainserve:proxy:routing_refused"] == 1
    assert answered_by(proxy, 2) == [1, 1]
    write_routing(path, route(canary=100))
    assert proxy.router.poll()
    assert answered_by(proxy, 2) == [2, 2]
    assert page(proxy)[":trainserve:proxy:routing_refused"] == 0


@pytest.mark.unit
def test_a_candidate_beyond_int64_is_refused_and_the_shadow_keeps_comparing(proxy_for, three_versions, caplog):
    proxy = proxy_for(route(shadow=100))
    path = proxy.config.routing_file
    path.write_text(json.dumps({"schema": SCHEMA, "models": {"m": {"candidate": 2**63, "shadow_percent": 100}}}))
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="trainserve.proxy.router"):
        assert not proxy.router.poll()
    assert len(caplog.records) == 1 and "candidate 9223372036854775808: expected" in caplog.text, caplog.text
    n = 2 * proxy.config.shadow_workers  # as many copies as would have ended every worker
    assert answered_by(proxy, n) == [1] * n
    compared = ':trainserve:proxy:shadow_requests{model_name="m",version="2",outcome="compared"}'
    three_versions.wait_for(lambda: page(proxy).get(compared) == n, "every copy compared")


class RecordingUpstream:
    """A PredictionService that records each request's model_spec and answers with the version TF Serving would
    resolve: the one named, 1 for `stable`, else its highest, 3 (raw bytes: model_spec is field 2 of each answer)."""

    METHODS = ("Predict", "Classify", "Regress")

    def __init__(self) -> None:
        self.specs: list[tuple[str, model_pb2.ModelSpec]] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(4))
        handlers = {m: grpc.unary_unary_rpc_method_handler(self._answer(m)) for m in self.METHODS}
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("tensorflow.serving.PredictionService", handlers),)
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def _answer(self, method: str):
        def answer(request: bytes, context) -> bytes:
            spec = request_spec(request)
            self.specs.append((method, spec))
            answered = model_pb2.ModelSpec(name=spec.name)
            version = spec.version.value if spec.HasField("version") else 1 if spec.version_label == "stable" else 3
            answered.version.value = version
            return length_delimited(2, answered.SerializeToString())

        return answer


@pytest.mark.unit
def test_version_less_classify_and_regress_are_sent_as_stable(tmp_path):
    upstream = RecordingUpstream()
    write_routing(tmp_path / "routing.json", route(canary=0))
    config = ProxyConfig(
        upstream=f"127.0.0.1:{upstream.port}",
        upstream_rest="",
        port=0,
        rest_port=0,
        filename_prefix=str(tmp_path / "c"),
        sampling_rate=0.0,
        routing_file=tmp_path / "routing.json",
        routing_poll_seconds=3600,
    )
    proxy = Proxy(config)
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{proxy.port}")
        for method in RecordingUpstream.METHODS:
            for spec in (model_pb2.ModelSpec(name="m"), model_pb2.ModelSpec(name="n")):
                channel.unary_unary(f"/tensorflow.serving.PredictionService/{method}")(
                    length_delimited(1, spec.SerializeToString()), timeout=30
                )
        channel.close()
    finally:
        proxy.stop(5)
        upstream.server.stop(None)
    sent = [(method, spec.name, spec.version_label, spec.HasField("version")) for method, spec in upstream.specs]
    assert sent == [
        (m, name, "stable" if name == "m" else "", False) for m in RecordingUpstream.METHODS for name in "mn"
    ]
    counted = {(k[0], k[1], k[2], k[4]): v for k, v in proxy.metrics.requests.items()}
    apis = ("predict", "classify", "regress")
    assert counted == {
        **{("m", "1", api, "stable"): 1 for api in apis},
        **{("n", "3", api, "direct"): 1 for api in apis},
    }
