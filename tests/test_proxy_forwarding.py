"""`trainserve proxy` in front of serve-local: a third-party client (the TF Serving API's own stubs) gets the same
answers, status codes and messages through the proxy as direct, over plaintext and mutual TLS, deadline exceeded
and not found included; REST is passed through; sampled Predict calls are written with the bytes that crossed."""

from __future__ import annotations

import http.client
import io
import json
import logging
import threading
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
from google.protobuf import wrappers_pb2
from hypothesis import given, settings
from hypothesis import strategies as st
from test_tls import SERVICE, make_pki, mutual, ssl_config  # noqa: F401  (make_pki: the session's certificates)

from conftest import DIRECT, Gate, install_version, save_gated_model
from serving_fixtures import IMAGES, predict_request, running_proxy
from trainserve.model_server_config import render_model_config, single_model_config
from trainserve.proxy.config import READY_PATH, ListenTls
from trainserve.proxy.rest_proxy import BadBody, read_chunked
from trainserve.proxy.server import Proxy
from trainserve.tensors import to_tensor_proto
from trainserve.tfrecord import iter_records
from trainserve.tls import ClientTls


def serve_m_and_g(root: Path, model_versions, serve_in_process, *flags: str):
    """serve-local with the tiny CNN as m and the gated model as g (a request held until the test opens its gate)."""
    install_version(model_versions[0], root / "m", 1)
    install_version(save_gated_model(root / "gated"), root / "g", 1)
    config = single_model_config("m", str(root / "m"))
    config.model_config_list.config.add(name="g", base_path=str(root / "g"), model_platform="tensorflow")
    (root / "models.config").write_text(render_model_config(config))
    server = serve_in_process(f"--model_config_file={root / 'models.config'}", *flags)
    server.wait_available("m", 1)
    server.wait_available("g", 1)
    return server


class Client:
    """The tensorflow-serving-api wheel's stubs on one channel (plaintext, or TLS with `tls`)."""

    def __init__(self, target: str, tls: ClientTls | None = None):
        from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

        if tls is None:
            self.channel = grpc.insecure_channel(target)
        else:
            options = [("grpc.ssl_target_name_override", tls.server_name)]
            self.channel = grpc.secure_channel(target, tls.credentials(), options=options)
        self.predict = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)
        self.models = model_service_pb2_grpc.ModelServiceStub(self.channel)

    def outcome(self, call: str, request, timeout: float = 30, metadata=()):
        """(status code name, details, response or None), as the client sees them."""
        stub = self.models if call == "GetModelStatus" else self.predict
        try:
            return "OK", "", getattr(stub, call)(request, timeout=timeout, metadata=metadata)
        except grpc.RpcError as err:
            return err.code().name, err.details(), None


def calls():
    """(id, method, request) of every kind of answer the proxy must pass on unchanged."""
    from tensorflow_serving.apis import classification_pb2, get_model_metadata_pb2, get_model_status_pb2

    metadata = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    metadata.model_spec.name = "m"
    status = get_model_status_pb2.GetModelStatusRequest()
    status.model_spec.name = "m"
    missing_version = get_model_status_pb2.GetModelStatusRequest()
    missing_version.model_spec.name = "m"
    missing_version.model_spec.version.CopyFrom(wrappers_pb2.Int64Value(value=9))
    classify = classification_pb2.ClassificationRequest()
    classify.model_spec.name = "m"
    return [
        ("predict", "Predict", predict_request()),
        ("predict-version-1", "Predict", predict_request(version=1)),
        ("predict-unknown-model", "Predict", predict_request(model="nope")),
        ("predict-unknown-version", "Predict", predict_request(version=9)),
        ("predict-bad-input", "Predict", predict_request(pixels=IMAGES)),
        ("metadata", "GetModelMetadata", metadata),
        ("status", "GetModelStatus", status),
        ("status-unknown-version", "GetModelStatus", missing_version),
        ("classify-unimplemented", "Classify", classify),
    ]


def proxy_for(upstream, tmp_path: Path, **fields) -> Proxy:
    return running_proxy(upstream, tmp_path / "captures" / "proxy", **fields)


def records(directory: Path) -> list:
    from tensorflow_serving.apis import prediction_log_pb2

    out = []
    for path in sorted(directory.glob("*.tfrecord")):
        with open(path, "rb") as stream:
            out += [prediction_log_pb2.PredictionLog.FromString(r) for r in iter_records(stream)]
    return out


def deadline_outcomes(client: Client, directory: Path) -> tuple[str, str]:
    """A Predict held by the gated model past the client's deadline: (code, details) the client gets."""
    from tensorflow_serving.apis import predict_pb2

    directory.mkdir()
    gate = Gate(directory)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "g"
    for key, value in gate.inputs.items():
        to_tensor_proto(value, into=request.inputs[key])
    seen = {}
    caller = threading.Thread(target=lambda: seen.update(out=client.outcome("Predict", request, timeout=1.0)))
    caller.start()
    gate.wait_arrived()  # the request is at the model, held: the deadline passes while it waits
    caller.join(60)
    gate.open()
    code, details, _ = seen["out"]
    return code, details


EXPECTED_CODES = {
    "predict": "OK",
    "predict-version-1": "OK",
    "predict-unknown-model": "NOT_FOUND",
    "predict-unknown-version": "NOT_FOUND",
    "predict-bad-input": "INVALID_ARGUMENT",
    "metadata": "OK",
    "status": "OK",
    "status-unknown-version": "NOT_FOUND",
    "classify-unimplemented": "UNIMPLEMENTED",
}


@pytest.fixture
def plain(tmp_path, model_versions, serve_in_process):
    upstream = serve_m_and_g(tmp_path, model_versions, serve_in_process)
    proxy = proxy_for(upstream, tmp_path)
    yield upstream, proxy
    proxy.stop()


@pytest.mark.unit
def test_the_serving_apis_own_stubs_get_the_same_answers_and_codes_through_the_proxy(plain, tmp_path):
    upstream, proxy = plain
    direct, through = Client(upstream.target), Client(f"127.0.0.1:{proxy.port}")
    sent, codes = [], {}
    for name, method, request in calls():
        answer = through.outcome(method, request, metadata=[("x-request-id", name)])
        assert answer == direct.outcome(method, request), name
        codes[name] = answer[0]
        if method == "Predict" and answer[0] == "OK":
            sent.append((name, request, answer[2]))
    assert codes == EXPECTED_CODES

    assert deadline_outcomes(through, tmp_path / "via-proxy")[0] == "DEADLINE_EXCEEDED"
    assert deadline_outcomes(direct, tmp_path / "direct")[0] == "DEADLINE_EXCEEDED"

    proxy.stop()  # the queued records are written
    logged = {log.log_metadata.request_origin: log for log in records(tmp_path / "captures")}
    assert sorted(logged) == sorted(name for name, _, _ in sent)  # every successful Predict, nothing else
    for name, request, response in sent:
        log = logged[name]
        assert log.predict_log.request.SerializeToString() == request.SerializeToString()
        assert log.predict_log.response == response
        spec = log.log_metadata.model_spec
        assert (spec.name, spec.version.value, spec.signature_name) == ("m", 1, "serving_default")


def rest(url: str, body: dict | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    try:
        with DIRECT.open(urllib.request.Request(url, data, method="POST" if data else "GET"), timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def chunked_post(address: str, path: str, body: dict) -> tuple[int, dict]:
    """A POST whose body is sent in chunks (Transfer-Encoding: chunked, no Content-Length), as streaming clients do."""
    data = json.dumps(body).encode()
    connection = http.client.HTTPConnection(address, timeout=30)
    try:
        chunks = (data[i : i + 100] for i in range(0, len(data), 100))
        connection.request("POST", path, chunks, {"Content-Type": "application/json"}, encode_chunked=True)
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        connection.close()


@pytest.mark.unit
def test_rest_is_passed_through_and_the_proxy_counts_what_it_wrote(plain):
    upstream, proxy = plain
    via = f"http://127.0.0.1:{proxy.rest_port}"
    instances = {"instances": np.zeros((2, 8, 8, 1), int).tolist()}
    for path, body in [
        ("/v1/models/m", None),
        ("/v1/models/m/metadata", None),
        ("/v1/models/nope", None),
        ("/v1/models/m:predict", instances),
        ("/v1/models/m/versions/9:predict", instances),
        ("/v1/models/m:predict", {"instances": "not a list"}),
    ]:
        assert rest(via + path, body) == rest(upstream.rest + path, body), path
    chunked = chunked_post(f"127.0.0.1:{proxy.rest_port}", "/v1/models/m:predict", instances)
    assert chunked == rest(upstream.rest + "/v1/models/m:predict", instances)
    assert chunked[0] == 200
    Client(f"127.0.0.1:{proxy.port}").outcome("Predict", predict_request())
    proxy.writer.close()
    with DIRECT.open(via + "/monitoring/proxy/metrics", timeout=10) as page:
        text = page.read().decode()
    assert ':trainserve:capture:records_written{filename_prefix="' in text
    assert [line for line in text.splitlines() if line.startswith(":trainserve:capture:records_written")][0].endswith(
        " 1"
    )


@pytest.mark.integration
def test_mutual_tls_on_both_sides(tmp_path, model_versions, serve_in_process, pki, caplog):
    upstream = serve_m_and_g(
        tmp_path, model_versions, serve_in_process, f"--ssl_config_file={ssl_config(tmp_path / 'ssl', pki, True)}"
    )
    listen = ListenTls(pki.server_crt, pki.server_key, pki.ca_crt)
    proxy = proxy_for(upstream, tmp_path, tls=mutual(pki), listen_tls=listen)
    try:
        direct, through = Client(upstream.target, mutual(pki)), Client(f"127.0.0.1:{proxy.port}", mutual(pki))
        for name, method, request in calls():
            assert through.outcome(method, request) == direct.outcome(method, request), name
        assert deadline_outcomes(through, tmp_path / "via-proxy")[0] == "DEADLINE_EXCEEDED"
        stranger = Client(f"127.0.0.1:{proxy.port}", mutual(pki, client="stranger"))
        assert stranger.outcome("Predict", predict_request())[0] == "UNAVAILABLE"  # its certificate is refused
    finally:
        proxy.stop()
    assert len(records(tmp_path / "captures")) == 2  # the two successful Predicts

    # Toward a mutual-TLS server without a client certificate, every call fails: not Ready, and said in the log.
    caplog.set_level(logging.INFO, logger="trainserve.proxy")
    tls = ClientTls(pki.ca_crt, server_name=SERVICE)
    no_cert = proxy_for(upstream, tmp_path / "no-cert", tls=tls, upstream_wait=0.25)
    try:
        status, reason = get(f"http://127.0.0.1:{no_cert.rest_port}{READY_PATH}")
        assert status == 503 and f"TF Serving's gRPC at {upstream.target}: UNAVAILABLE" in reason
        assert Client(f"127.0.0.1:{no_cert.port}").outcome("Predict", predict_request())[0] == "UNAVAILABLE"
    finally:
        no_cert.stop()
    warnings = [r.getMessage() for r in caplog.records if "cannot reach TF Serving's gRPC" in r.getMessage()]
    assert len(warnings) == 1, warnings


def get(url: str) -> tuple[int, str]:
    try:
        with DIRECT.open(url, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@pytest.mark.unit
@settings(max_examples=100, deadline=None)
@given(body=st.binary(max_size=3000), cuts=st.lists(st.integers(1, 700), max_size=12), data=st.data())
def test_a_chunked_body_is_read_whole_however_it_is_cut(body, cuts, data):
    pieces, start = [], 0
    for size in cuts:
        if start < len(body):
            pieces.append(body[start : start + size])
            start += size
    if start < len(body):
        pieces.append(body[start:])
    wire = b""
    for piece in pieces:
        extension = data.draw(st.sampled_from([b"", b";name=value"]))
        wire += f"{len(piece):x}".encode() + extension + b"\r\n" + piece + b"\r\n"
    wire += b"0\r\n" + data.draw(st.sampled_from([b"", b"X-Checksum: 1\r\n"])) + b"\r\n" + b"NEXT REQUEST"
    stream = io.BytesIO(wire)
    assert read_chunked(stream) == body
    assert stream.read() == b"NEXT REQUEST"  # nothing of the next request on the connection was consumed


@pytest.mark.unit
@pytest.mark.parametrize("wire", [b"zz\r\nab\r\n0\r\n\r\n", b"2\r\nabX\r\n0\r\n\r\n"], ids=["size", "no-crlf"])
def test_a_malformed_chunked_body_is_refused(wire):
    with pytest.raises(BadBody):
        read_chunked(io.BytesIO(wire))
