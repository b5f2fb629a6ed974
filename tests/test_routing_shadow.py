"""Shadow copies never cost the client: a candidate that does not answer (an upstream in this process that holds
every call to version 2 until the test releases it) leaves stable's answers on time, fills the queue, bounded in
copies and in bytes, and drops the rest, counted and never sent; copies are shed, never sent, while clients' calls
are in flight; the rewrite and the comparison run off the event loop; a copy that cannot be addressed fails alone,
its worker going on; every copy ends in exactly one outcome, at stop too. Also the wire-level model_spec rewrite
(hypothesis)."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter
from concurrent import futures

import grpc
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from serving_fixtures import NO_LATENCY_SHED
from trainserve.protos import predict_pb2
from trainserve.proxy import shadow as shadow_module
from trainserve.proxy.config import ProxyConfig
from trainserve.proxy.grpc_proxy import MESSAGE_OPTIONS
from trainserve.proxy.proxy_metrics import SHADOW_OUTCOMES, ProxyMetrics
from trainserve.proxy.routing import ModelRoute, Routing, write_routing
from trainserve.proxy.server import Proxy
from trainserve.proxy.shadow import Shadow
from trainserve.proxy.shadow_compare import Comparison
from trainserve.proxy.wire import answered_version, request_spec, with_version
from trainserve.tensors import to_tensor_proto

pytestmark = pytest.mark.unit
PREDICT = "/tensorflow.serving.PredictionService/Predict"
PROBABILITIES = np.array([[0.1, 0.9], [0.8, 0.2]], np.float32)
MiB = 2**20


def response(version: int, probabilities=PROBABILITIES, name: str = "probabilities") -> predict_pb2.PredictResponse:
    answer = predict_pb2.PredictResponse()
    answer.model_spec.name = "m"
    answer.model_spec.version.value = version
    to_tensor_proto(probabilities, into=answer.outputs[name])
    return answer


def stable_request(images: np.ndarray | None = None) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name, request.model_spec.version_label = "m", "stable"
    if images is not None:
        to_tensor_proto(images, into=request.inputs["images"])
    return request


class Serving:
    """A PredictionService upstream: label `stable` answers as version 1, version 2 (the candidate) with
    `answers[2]`. While `hold_candidate`, each call to version 2 sets `arrived` and waits for `release`; so does
    each call carrying the metadata `x-hold: 1`. `calls` counts the calls each version got."""

    def __init__(self, hold_candidate: bool = True, candidate_answer: predict_pb2.PredictResponse | None = None):
        self.arrived, self.release = threading.Event(), threading.Event()
        self.hold_candidate, self.calls, self._lock = hold_candidate, Counter(), threading.Lock()
        self.answers = {1: response(1), 2: candidate_answer or response(2)}
        self.server = grpc.server(futures.ThreadPoolExecutor(8), options=MESSAGE_OPTIONS)
        handler = grpc.unary_unary_rpc_method_handler(
            self.predict, predict_pb2.PredictRequest.FromString, predict_pb2.PredictResponse.SerializeToString
        )
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(PREDICT.split("/")[1], {"Predict": handler}),)
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def predict(self, request, context):
        version = request.model_spec.version.value if request.model_spec.HasField("version") else 1
        with self._lock:
            self.calls[version] += 1
        if (version == 2 and self.hold_candidate) or ("x-hold", "1") in context.invocation_metadata():
            self.arrived.set()
            assert self.release.wait(60), "the test never released the call"
        return self.answers[version]

    def stop(self) -> None:
        self.release.set()
        self.server.stop(None)


@pytest.fixture
def serving():
    upstream = Serving()
    yield upstream
    upstream.stop()


def start_proxy(upstream: Serving, tmp_path, **flags) -> Proxy:
    path = tmp_path / "routing.json"
    write_routing(path, Routing({"m": ModelRoute(2, shadow_percent=100)}))
    config = ProxyConfig(
        upstream=f"127.0.0.1:{upstream.port}",
        upstream_rest="",
        port=0,
        rest_port=0,
        filename_prefix=str(tmp_path / "c"),
        sampling_rate=0.0,
        routing_file=path,
        **{**NO_LATENCY_SHED, **flags},
    )
    return Proxy(config, uniform=random.Random(0).random)


@pytest.fixture
def held(serving, tmp_path):
    proxy = start_proxy(serving, tmp_path, shadow_workers=1, shadow_queue=2)
    channel = grpc.insecure_channel(f"127.0.0.1:{proxy.port}")
    call = channel.unary_unary(
        PREDICT, predict_pb2.PredictRequest.SerializeToString, predict_pb2.PredictResponse.FromString
    )
    yield serving, proxy, lambda: call(stable_request(), timeout=30)
    channel.close()
    serving.release.set()
    proxy.stop(5)


def outcomes(metrics: ProxyMetrics) -> dict[str, int]:
    return {o: n for (_, _, o), n in metrics.shadow.items()}


def test_a_held_shadow_never_holds_the_client_and_a_full_queue_drops_counted(held):
    upstream, proxy, call = held
    assert call().model_spec.version.value == 1
    assert upstream.arrived.wait(30), "the first copy never reached the candidate"
    answers = [call() for _ in range(4)]  # while the candidate holds the first copy: each answered at once
    assert not upstream.release.is_set()
    assert [a.model_spec.version.value for a in answers] == [1] * 4
    assert outcomes(proxy.metrics) == {"dropped_queue_full": 2}  # one held by the worker, two queued, two dropped
    assert proxy.metrics.queued() == 2
    done = threading.Event()
    proxy.metrics.compared = counting(proxy.metrics.compared, 3, done)
    upstream.release.set()
    assert done.wait(30), "the queued copies were never compared"
    assert outcomes(proxy.metrics) == {"dropped_queue_full": 2, "compared": 3}
    assert upstream.calls[2] == 3, "a dropped copy was sent"
    assert proxy.metrics.pairs[("m", "2")] == proxy.metrics.classified[("m", "2")] == 3 * len(PROBABILITIES)
    assert proxy.metrics.flips[("m", "2")] == 0


def counting(count, n: int, done: threading.Event):
    """`count` (a ProxyMetrics method) that sets `done` at its n-th call."""
    calls = []

    def wrapped(*args):
        count(*args)
        calls.append(1)
        if len(calls) == n:
            done.set()

    return wrapped


def test_copies_held_or_queued_at_stop_are_counted_cut(held):
    upstream, proxy, call = held
    call()
    assert upstream.arrived.wait(30)
    call(), call(), call()
    stopped = proxy.stop(5)
    assert stopped.shadow_cut == 3 and "3 shadow cop(ies) not sent" in stopped.summary()
    assert outcomes(proxy.metrics) == {"dropped_queue_full": 1, "cut": 3}  # 4 offered, each counted once
    assert upstream.calls[2] == 1, "a copy queued at stop was sent"


def run_shadow(upstream: Serving, scenario, in_flight=lambda: 0, clock=time.perf_counter, **flags) -> ProxyMetrics:
    """`scenario(shadow)` (a coroutine function) run against a Shadow that sends to `upstream`, on a loop of its
    own (`clock`: the shadow's); returns the shadow's metrics once it has stopped."""
    metrics = ProxyMetrics()

    async def main() -> None:
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{upstream.port}", options=MESSAGE_OPTIONS)
        shadow = Shadow(channel, metrics, ProxyConfig(**flags), in_flight, clock)
        shadow.start()
        try:
            await scenario(shadow)
        finally:
            upstream.release.set()
            await shadow.stop()
            await channel.close()

    asyncio.run(main())
    return metrics


async def waited(event: threading.Event) -> bool:
    """Wait for `event` without holding the loop."""
    return await asyncio.to_thread(event.wait, 30)


def test_300_copies_of_2_mib_never_hold_more_than_the_byte_budget(serving):
    request = stable_request(np.zeros(2 * MiB, np.uint8)).SerializeToString()
    stable = response(1).SerializeToString()
    budget, size = ProxyConfig().shadow_max_bytes, len(request) + len(stable)
    fits, held, done = budget // size, [], threading.Event()

    async def offer_300(shadow: Shadow) -> None:
        shadow.metrics.compared = counting(shadow.metrics.compared, fits, done)
        for _ in range(300):
            shadow.offer("m", 2, request, stable, ())
            held.append(shadow.held_bytes)
            await asyncio.sleep(0)  # the workers take copies between two offers, as between two calls
        assert await waited(serving.arrived)
        serving.release.set()
        assert await waited(done), "the copies held were never compared"
        held.append(shadow.held_bytes)

    metrics = run_shadow(serving, offer_300, shadow_workers=2)
    assert max(held) == fits * size <= budget
    assert held[-1] == 0
    assert outcomes(metrics) == {"compared": fits, "dropped_queue_full": 300 - fits}
    assert serving.calls[2] == fits, "a dropped copy was sent"


def test_the_rewrite_and_a_12_mib_comparison_leave_the_event_loop_free(monkeypatch):
    probabilities = np.random.default_rng(2).random((12 * MiB // 40, 10), np.float32)
    upstream = Serving(hold_candidate=False, candidate_answer=response(2, probabilities))
    loop, free, done = [], {}, threading.Event()

    def watched(work):
        """`work` that records whether a callback scheduled on the loop meanwhile ran before it finished: on the
        loop's own thread, the callback could only run after."""

        def run(*args):
            ran = threading.Event()
            loop[0].call_soon_threadsafe(ran.set)
            free[work.__name__] = ran.wait(5)
            return work(*args)

        return run

    monkeypatch.setattr(shadow_module, "compare", watched(shadow_module.compare))
    monkeypatch.setattr(shadow_module, "addressed", watched(shadow_module.addressed))

    async def one_copy(shadow: Shadow) -> None:
        loop.append(asyncio.get_running_loop())
        shadow.metrics.compared = counting(shadow.metrics.compared, 1, done)
        shadow.offer("m", 2, stable_request().SerializeToString(), response(1, probabilities).SerializeToString(), ())
        assert await waited(done)

    try:
        metrics = run_shadow(upstream, one_copy)
    finally:
        upstream.stop()
    assert free == {"addressed": True, "compare": True}
    assert metrics.pairs[("m", "2")] == len(probabilities) and metrics.flips[("m", "2")] == 0


def test_a_copy_is_shed_never_sent_while_clients_calls_are_in_flight(serving):
    clients, done = [0], threading.Event()

    async def busy_quiet_busy(shadow: Shadow) -> None:
        shadow.metrics.shadow_outcome = counting(shadow.metrics.shadow_outcome, 2, done)
        copy = ("m", 2, stable_request().SerializeToString(), response(1).SerializeToString(), ())
        clients[0] = 2
        shadow.offer(*copy)  # shed as it is offered
        clients[0] = 1
        shadow.offer(*copy)  # sent: the candidate holds it
        assert await waited(serving.arrived)
        shadow.offer(*copy)  # queued behind it
        clients[0] = 2
        serving.release.set()
        assert await waited(done), "the queued copy was never shed"  # when the worker took it

    metrics = run_shadow(serving, busy_quiet_busy, lambda: clients[0], shadow_workers=1, shadow_shed_in_flight=2)
    assert outcomes(metrics) == {"shed": 2, "compared": 1}
    assert serving.calls[2] == 1, "a shed copy was sent"


def test_the_proxy_sheds_the_copy_of_a_call_answered_while_another_is_in_flight(serving, tmp_path):
    serving.hold_candidate = False
    proxy = start_proxy(serving, tmp_path, shadow_shed_in_flight=1)
    done = threading.Event()
    proxy.metrics.compared = counting(proxy.metrics.compared, 1, done)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{proxy.port}") as channel:
            call = channel.unary_unary(
                PREDICT, predict_pb2.PredictRequest.SerializeToString, predict_pb2.PredictResponse.FromString
            )
            held_call = call.future(stable_request(), timeout=30, metadata=(("x-hold", "1"),))
            assert serving.arrived.wait(30)
            call(stable_request(), timeout=30)  # answered while the held call is in flight: its copy shed
            serving.release.set()
            held_call.result()  # answered with no other call in flight: its copy sent
            assert done.wait(30)
    finally:
        proxy.stop(5)
    assert outcomes(proxy.metrics) == {"shed": 1, "compared": 1}
    assert serving.calls == {1: 2, 2: 1}


def test_a_candidate_with_no_output_in_common_is_incomparable_not_an_error():
    upstream = Serving(hold_candidate=False, candidate_answer=response(2, PROBABILITIES, name="scores"))
    done = threading.Event()

    async def one_copy(shadow: Shadow) -> None:
        shadow.metrics.shadow_outcome = counting(shadow.metrics.shadow_outcome, 1, done)
        shadow.offer("m", 2, stable_request().SerializeToString(), response(1).SerializeToString(), ())
        assert await waited(done)

    try:
        metrics = run_shadow(upstream, one_copy)
    finally:
        upstream.stop()
    assert outcomes(metrics) == {"incomparable": 1}
    assert metrics.pairs[("m", "2")] == 0


def test_a_copy_to_a_version_past_int64_is_an_error_and_the_worker_goes_on():
    upstream = Serving(hold_candidate=False)
    done = threading.Event()

    async def two_copies(shadow: Shadow) -> None:
        shadow.metrics.compared = counting(shadow.metrics.compared, 1, done)
        request, stable = stable_request().SerializeToString(), response(1).SerializeToString()
        shadow.offer("m", 2**63, request, stable, ())  # protobuf's int64 cannot hold it
        shadow.offer("m", 2, request, stable, ())  # the same single worker takes this one next
        assert await waited(done), "the worker died with the first copy"

    try:
        metrics = run_shadow(upstream, two_copies, shadow_workers=1)
    finally:
        upstream.stop()
    assert metrics.shadow == {("m", str(2**63), "error"): 1, ("m", "2", "compared"): 1}
    assert upstream.calls == {2: 1}


def test_the_page_exports_every_outcome_and_the_classified_pairs():
    metrics = ProxyMetrics()
    metrics.shadow_outcome("m", 2, "shed")
    metrics.compared("m", 2, Comparison(pairs=4, classified=4, flips=1, abs_diff=0.5), 10.0)
    metrics.compared("m", 2, Comparison(pairs=3, classified=0, flips=0, abs_diff=2.0), 10.0)
    families = {f.name: f for f in text_string_to_metric_families("\n".join(metrics.lines()) + "\n")}
    by_outcome = {s.labels["outcome"]: s.value for s in families[":trainserve:proxy:shadow_requests"].samples}
    assert by_outcome == {o: {"shed": 1, "compared": 2}.get(o, 0) for o in SHADOW_OUTCOMES}
    assert set(SHADOW_OUTCOMES) == {"compared", "incomparable", "shed", "dropped_queue_full", "error", "cut"}
    for name, value in (("pairs", 7), ("classified_pairs", 4), ("flips", 1), ("abs_diff_sum", 2.5)):
        (sample,) = families[f":trainserve:proxy:shadow_{name}"].samples
        assert sample.labels == {"model_name": "m", "version": "2"} and sample.value == value


@settings(max_examples=50, deadline=None)
@given(
    name=st.text(min_size=1, max_size=20),
    label=st.text(max_size=10),
    signature=st.text(max_size=10),
    version=st.integers(0, 2**62),
    rows=st.integers(0, 5),
    filter_=st.lists(st.text(max_size=5), max_size=3),
)
def test_with_version_rewrites_the_model_spec_and_keeps_every_other_field(
    name, label, signature, version, rows, filter_
):
    request = predict_pb2.PredictRequest()
    request.model_spec.name, request.model_spec.signature_name = name, signature
    if label:
        request.model_spec.version_label = label
    to_tensor_proto(np.arange(rows * 3, dtype=np.float32).reshape(rows, 3), into=request.inputs["x"])
    request.output_filter.extend(filter_)
    wire = request.SerializeToString()
    spec = request_spec(wire)
    assert spec == request.model_spec
    rewritten = predict_pb2.PredictRequest.FromString(with_version(wire, spec, version))
    expected = predict_pb2.PredictRequest()
    expected.CopyFrom(request)
    expected.model_spec.version.value = version
    assert rewritten == expected
    assert answered_version(response(version).SerializeToString()) == version
    assert answered_version(b"") is None
