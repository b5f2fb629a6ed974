"""Shadow copies never hold a client: a candidate that does not answer (an upstream in this process that holds
every call to version 2 until the test releases it) leaves stable's answers on time, fills the bounded queue and
drops the rest, counted; every copy ends in exactly one outcome, at stop too. Also the wire-level model_spec
rewrite (hypothesis) and the answer comparison against an independent count."""

from __future__ import annotations

import random
import threading
from concurrent import futures

import grpc
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainserve.capture.config import ProxyConfig
from trainserve.capture.proxy import CaptureProxy
from trainserve.capture.routing import ModelRoute, Routing, write_routing
from trainserve.capture.shadow import Incomparable, compare
from trainserve.capture.wire import answered_version, request_spec, with_version
from trainserve.protos import predict_pb2
from trainserve.tensors import to_tensor_proto

pytestmark = pytest.mark.unit
PREDICT = "/tensorflow.serving.PredictionService/Predict"
PROBABILITIES = np.array([[0.1, 0.9], [0.8, 0.2]], np.float32)


def response(version: int, probabilities=PROBABILITIES) -> predict_pb2.PredictResponse:
    answer = predict_pb2.PredictResponse()
    answer.model_spec.name = "m"
    answer.model_spec.version.value = version
    to_tensor_proto(probabilities, into=answer.outputs["probabilities"])
    return answer


class HeldCandidate:
    """A PredictionService upstream: stable (label `stable`) answers at once as version 1; each call to version 2
    sets `arrived` and waits for `release`."""

    def __init__(self) -> None:
        self.arrived, self.release = threading.Event(), threading.Event()
        self.server = grpc.server(futures.ThreadPoolExecutor(8))
        handler = grpc.unary_unary_rpc_method_handler(
            self.predict, predict_pb2.PredictRequest.FromString, predict_pb2.PredictResponse.SerializeToString
        )
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(PREDICT.split("/")[1], {"Predict": handler}),)
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def predict(self, request, context):
        if request.model_spec.HasField("version") and request.model_spec.version.value == 2:
            self.arrived.set()
            assert self.release.wait(60), "the test never released the shadow call"
            return response(2)
        return response(1)

    def stop(self) -> None:
        self.release.set()
        self.server.stop(None)


@pytest.fixture
def held(tmp_path):
    upstream = HeldCandidate()
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
        shadow_workers=1,
        shadow_queue=2,
    )
    proxy = CaptureProxy(config, uniform=random.Random(0).random)
    channel = grpc.insecure_channel(f"127.0.0.1:{proxy.port}")
    call = channel.unary_unary(
        PREDICT, predict_pb2.PredictRequest.SerializeToString, predict_pb2.PredictResponse.FromString
    )
    request = predict_pb2.PredictRequest()
    request.model_spec.name, request.model_spec.version_label = "m", "stable"
    yield upstream, proxy, lambda: call(request, timeout=30)
    channel.close()
    upstream.release.set()
    proxy.stop(5)
    upstream.stop()


def outcomes(proxy: CaptureProxy) -> dict[str, int]:
    return {o: n for (_, _, o), n in proxy.metrics.shadow.items()}


def test_a_held_shadow_never_holds_the_client_and_a_full_queue_drops_counted(held):
    upstream, proxy, call = held
    assert call().model_spec.version.value == 1
    assert upstream.arrived.wait(30), "the first copy never reached the candidate"
    answers = [call() for _ in range(4)]  # while the candidate holds the first copy: each answered at once
    assert not upstream.release.is_set()
    assert [a.model_spec.version.value for a in answers] == [1] * 4
    assert outcomes(proxy) == {"dropped_queue_full": 2}  # one held by the worker, two queued, two dropped
    assert proxy.metrics.queued() == 2
    done = threading.Event()
    proxy.metrics.compared = counting(proxy.metrics.compared, 3, done)
    upstream.release.set()
    assert done.wait(30), "the queued copies were never compared"
    assert outcomes(proxy) == {"dropped_queue_full": 2, "compared": 3}
    assert proxy.metrics.pairs[("m", "2")] == 3 * len(PROBABILITIES)
    assert proxy.metrics.flips[("m", "2")] == 0


def counting(compared, n: int, done: threading.Event):
    """`compared` that sets `done` at its n-th call."""
    calls = []

    def wrapped(*args):
        compared(*args)
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
    assert outcomes(proxy) == {"dropped_queue_full": 1, "cut": 3}  # 4 offered, each counted once


def test_compare_counts_flips_and_regression_differences_as_numpy_does():
    rng = np.random.default_rng(1)
    a, b = rng.random((50, 4), np.float32), rng.random((50, 4), np.float32)
    y, z = rng.random(50, np.float32), rng.random(50, np.float32)
    stable, candidate = response(1, a), response(2, b)
    to_tensor_proto(y, into=stable.outputs["score"])
    to_tensor_proto(z, into=candidate.outputs["score"])
    pairs, flips, diff = compare(stable.SerializeToString(), candidate.SerializeToString())
    assert pairs == 50
    assert flips == sum(int(np.argmax(a[i]) != np.argmax(b[i])) for i in range(50))
    assert diff == pytest.approx(float(np.sum(np.abs(z.astype(np.float64) - y))), rel=1e-9)
    with pytest.raises(Incomparable):
        compare(response(1, a).SerializeToString(), response(2, a[:10]).SerializeToString())


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
