"""serve-local as a client sees it, in the test's own process: serve() on a thread, real sockets, and the
tensorflow-serving-api wheel's stubs and messages on the client side (what third-party clients use), so the
wire format is checked against TF Serving's own protos, not ours."""

from __future__ import annotations

import shutil
import threading
import urllib.error

import grpc
import numpy as np
import pytest
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
)

from conftest import install_version, save_foreign_model
from serving_fixtures import IMAGES, InProcessServer, expected, predict_request, rpc_error, stubs
from trainserve.savedmodel import serve_meta_graph
from trainserve.tensors import from_tensor_proto
from trainserve.training.publish import publish_or_discard, staging_dir


@pytest.mark.unit
def test_predict_matches_in_process_and_answers_in_val_fields(serve_in_process, model_versions, tmp_path):
    install_version(model_versions[0], tmp_path / "m", 1)
    server = serve_in_process("--model_name=m", f"--model_base_path={tmp_path / 'm'}")
    server.wait_available("m", 1)
    predict, _ = stubs(server)
    response = predict.Predict(predict_request(), timeout=30)
    assert response.model_spec.version.value == 1 and response.model_spec.signature_name == "serving_default"
    probabilities = response.outputs["probabilities"]
    assert probabilities.float_val and not probabilities.tensor_content, "real TF Serving answers in *_val form"
    want = expected(model_versions[0])
    np.testing.assert_allclose(from_tensor_proto(probabilities), want["probabilities"], atol=1e-6)
    np.testing.assert_array_equal(from_tensor_proto(response.outputs["classes"]), want["classes"])
    request = predict_request()
    request.output_filter.append("classes")
    assert list(predict.Predict(request, timeout=30).outputs) == ["classes"]
    assert "version 1: AVAILABLE" in server.log() and "3 warmup request(s)" in server.log()


@pytest.mark.integration
def test_new_version_swaps_in_without_failures_and_broken_one_keeps_old(serve_in_process, model_versions, tmp_path):
    base = tmp_path / "m"
    install_version(model_versions[0], base, 1)
    server = serve_in_process("--model_name=m", f"--model_base_path={base}")
    server.wait_available("m", 1)
    predict, status = stubs(server)
    # Each thread records the versions it was answered by, in its own order (sequential calls): one shared list
    # would interleave a late v1 answer of one thread after a v2 answer of the other.
    seen, failures, stop = ([], []), [], threading.Event()

    def hammer(answers: list[int]):
        while not stop.is_set():
            try:
                answers.append(predict.Predict(predict_request(), timeout=30).model_spec.version.value)
            except grpc.RpcError as exc:
                failures.append(exc)

    threads = [threading.Thread(target=hammer, args=(answers,)) for answers in seen]
    for thread in threads:
        thread.start()
    server.wait_for(lambda: all(len(a) >= 5 for a in seen), "answers from version 1")
    publish_or_discard(staging_dir(base), lambda p: shutil.copytree(model_versions[1], p, dirs_exist_ok=True), {}, None)
    after_v2 = lambda a: a[a.index(2) :] if 2 in a else []  # noqa: E731
    server.wait_for(lambda: all(len(after_v2(a)) >= 20 for a in seen), "20 answers per thread from version 2 on")
    stop.set()
    for thread in threads:
        thread.join()
    assert not failures, failures[:3]
    for answers in seen:
        assert answers[0] == 1 and set(answers) == {1, 2}
        assert 1 not in after_v2(answers), "once on v2, stays on v2"
    server.wait_for(lambda: server.versions("m").get(1) == "END", "version 1 unloaded")

    broken = install_version(model_versions[2], base, 3)
    (broken / "saved_model.pb").write_bytes(b"\x0a\x03not a saved model")
    server.wait_for(lambda: server.versions("m").get(3) == "END", "version 3 to fail")
    _, body = server.get("/v1/models/m/versions/3")
    failed = body["model_version_status"][0]
    assert failed["status"]["error_code"] != "OK" and "corrupt" in failed["status"]["error_message"]
    assert server.versions("m")[2] == "AVAILABLE"
    np.testing.assert_allclose(
        from_tensor_proto(predict.Predict(predict_request(), timeout=30).outputs["probabilities"]),
        expected(model_versions[1])["probabilities"],
        atol=1e-6,
    )
    grpc_status = status.GetModelStatus(
        get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "m"}), timeout=30
    ).model_version_status
    assert {s.version: s.state for s in grpc_status} == {1: 50, 2: 30, 3: 50}
    assert "load failed, END" in server.log()


CONFIG = """
model_config_list {{
  config {{
    name: "pinned" base_path: "{base}/pinned" model_platform: "tensorflow"
    model_version_policy {{ specific {{ versions: 1 versions: 2 }} }}
    version_labels {{ key: "stable" value: 1 }}
    version_labels {{ key: "canary" value: 2 }}
  }}
  config {{
    name: "every" base_path: "{base}/every" model_platform: "tensorflow"
    model_version_policy {{ all {{}} }}
  }}
}}
"""


@pytest.mark.unit
def test_config_file_policies_and_labels(serve_in_process, model_versions, tmp_path):
    for version, template in enumerate(model_versions, start=1):
        install_version(template, tmp_path / "pinned", version)
        install_version(template, tmp_path / "every", version)
    config = tmp_path / "models.config"
    config.write_text(CONFIG.format(base=tmp_path))
    server = serve_in_process(
        f"--model_config_file={config}",
        "--model_config_file_poll_wait_seconds=1",
        "--allow_version_labels_for_unavailable_models",  # labels at start: nothing is loaded yet
    )
    server.wait_available("pinned", 2)
    server.wait_available("every", 3)
    assert server.versions("pinned") == {1: "AVAILABLE", 2: "AVAILABLE"}, "specific: 3 is not served"
    assert server.versions("every") == {1: "AVAILABLE", 2: "AVAILABLE", 3: "AVAILABLE"}
    predict, _ = stubs(server)
    for label, version in (("stable", 1), ("canary", 2)):
        response = predict.Predict(predict_request("pinned", label=label), timeout=30)
        assert response.model_spec.version.value == version
        want = expected(model_versions[version - 1])["probabilities"]
        np.testing.assert_allclose(from_tensor_proto(response.outputs["probabilities"]), want, atol=1e-6)
        code, body = server.post(f"/v1/models/pinned/labels/{label}:predict", {"instances": IMAGES[:2].tolist()})
        assert code == 200 and np.allclose([p["probabilities"] for p in body["predictions"]], want[:2], atol=1e-5)
    assert server.get("/v1/models/pinned/labels/stable")[1]["model_version_status"][0]["version"] == "1"
    latest = predict.Predict(predict_request("every"), timeout=30)
    assert latest.model_spec.version.value == 3, "no version named: the newest"

    config.write_text(CONFIG.format(base=tmp_path).replace("versions: 1 versions: 2", "versions: 3"))
    server.wait_for(lambda: server.versions("pinned").get(3) == "AVAILABLE", "config reload to version 3")


@pytest.mark.unit
def test_rest_status_metadata_and_both_predict_formats(serve_in_process, model_versions, tmp_path):
    install_version(model_versions[0], tmp_path / "m", 4)
    server = serve_in_process("--model_name=m", f"--model_base_path={tmp_path / 'm'}")
    server.wait_available("m", 4)
    code, body = server.get("/v1/models/m")
    assert code == 200 and body == {
        "model_version_status": [
            {"version": "4", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
        ]
    }
    want = expected(model_versions[0])
    code, rows = server.post("/v1/models/m:predict", {"instances": IMAGES.tolist()})
    assert code == 200 and [r["classes"] for r in rows["predictions"]] == want["classes"].tolist()
    np.testing.assert_allclose([r["probabilities"] for r in rows["predictions"]], want["probabilities"], atol=1e-6)
    code, cols = server.post("/v1/models/m/versions/4:predict", {"inputs": {"images": IMAGES.tolist()}})
    assert code == 200 and cols["outputs"]["classes"] == want["classes"].tolist()
    np.testing.assert_allclose(cols["outputs"]["probabilities"], want["probabilities"], atol=1e-6)

    code, meta = server.get("/v1/models/m/metadata")
    assert code == 200 and meta["model_spec"] == {"name": "m", "signature_name": "", "version": "4"}
    signature = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert signature["inputs"]["images"]["dtype"] == "DT_UINT8"
    assert set(signature["outputs"]) == {"probabilities", "classes"}

    predict, _ = stubs(server)
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = "m"
    response = predict.GetModelMetadata(request, timeout=30)
    signature_map = get_model_metadata_pb2.SignatureDefMap()
    assert response.metadata["signature_def"].Unpack(signature_map)
    on_disk = serve_meta_graph(model_versions[0]).signature_def
    assert signature_map.signature_def["serving_default"] == on_disk["serving_default"]
    assert response.model_spec.version.value == 4

    assert server.get("/v1/models/nope")[0] == 404
    assert server.get("/v1/models/m/versions/9")[0] == 404
    code, err = server.post("/v1/models/m:predict", {"instances": [[1, 2]]})
    assert code == 400 and "expected uint8 [None, 8, 8, 1]" in err["error"]


@pytest.mark.unit
@pytest.mark.parametrize(
    "request_kwargs, code, message",
    [
        pytest.param({"model": "nope"}, grpc.StatusCode.NOT_FOUND, "Latest(nope)", id="unknown-model"),
        pytest.param({"version": 7}, grpc.StatusCode.NOT_FOUND, "Specific(m, 7)", id="unknown-version"),
        pytest.param({"label": "gold"}, grpc.StatusCode.INVALID_ARGUMENT, "version label: gold", id="unknown-label"),
        pytest.param({"signature": "nope"}, grpc.StatusCode.FAILED_PRECONDITION, '"nope" not found', id="signature"),
        pytest.param({"pixels": IMAGES}, grpc.StatusCode.INVALID_ARGUMENT, "unknown ['pixels']", id="input-name"),
        pytest.param(
            {"images": IMAGES.astype(np.float32)}, grpc.StatusCode.INVALID_ARGUMENT, "expected uint8", id="dtype"
        ),
        pytest.param(
            {"images": IMAGES[:, :4]}, grpc.StatusCode.INVALID_ARGUMENT, "expected uint8 [None, 8, 8, 1]", id="shape"
        ),
    ],
)
def test_errors_carry_tf_serving_status_codes(running_m, request_kwargs, code, message):
    predict, _ = stubs(running_m)
    error = rpc_error(predict.Predict, predict_request(**request_kwargs))
    assert error.code() == code and message in error.details()


@pytest.mark.unit
def test_classify_is_unimplemented_with_a_clear_message(running_m):
    predict, _ = stubs(running_m)
    error = rpc_error(predict.Classify, classification_pb2.ClassificationRequest(model_spec={"name": "m"}))
    assert error.code() == grpc.StatusCode.UNIMPLEMENTED and "Predict and GetModelMetadata" in error.details()


@pytest.fixture(scope="module")
def running_m(model_versions, tmp_path_factory):
    base = tmp_path_factory.mktemp("running") / "m"
    install_version(model_versions[0], base, 1)
    server = InProcessServer("--model_name=m", f"--model_base_path={base}")
    server.wait_available("m", 1)
    yield server
    assert server.stop() == 0


@pytest.mark.unit
def test_foreign_savedmodel_with_two_inputs_is_served(serve_in_process, tmp_path):
    save_foreign_model(tmp_path / "f" / "1")
    server = serve_in_process("--model_name=f", f"--model_base_path={tmp_path / 'f'}")
    server.wait_available("f", 1)
    predict, _ = stubs(server)
    x = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    offset = np.array([10, 20], np.int64)
    response = predict.Predict(predict_request("f", x=x, offset=offset), timeout=30)
    np.testing.assert_array_equal(from_tensor_proto(response.outputs["scaled"]), x * 2)
    np.testing.assert_array_equal(from_tensor_proto(response.outputs["shifted"]), offset + 1)
    assert response.outputs["shifted"].int64_val == [11, 21]
    code, body = server.post("/v1/models/f:predict", {"instances": [{"x": [1, 2, 3], "offset": 10}]})
    assert code == 200 and body["predictions"] == [{"scaled": [2, 4, 6], "shifted": 11, "total": 6}]
    code, body = server.post("/v1/models/f:predict", {"inputs": {"x": [[1, 1, 1]], "offset": [0]}})
    assert code == 200 and body["outputs"] == {"scaled": [[2, 2, 2]], "shifted": [1], "total": [3]}
    error = rpc_error(predict.Predict, predict_request("f", x=x, offset=offset.astype(np.int32)))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "'offset' is int32: expected int64" in error.details()


@pytest.mark.unit
def test_missing_base_path_is_polled_until_a_version_appears(serve_in_process, model_versions, tmp_path):
    base = tmp_path / "later"
    server = serve_in_process("--model_name=m", f"--model_base_path={base}")
    server.wait_for(lambda: "base path" in server.log() and "does not exist" in server.log(), "the waiting log line")
    with pytest.raises(urllib.error.URLError):  # ports stay closed until a version is AVAILABLE, as in TF Serving
        server.get("/v1/models/m")
    base.mkdir()
    server.wait_for(lambda: "no version published yet" in server.log(), "the empty-directory log line")
    (base / ".tmp-123").mkdir()  # non-numeric: ignored
    install_version(model_versions[0], base, 1)
    server.wait_available("m", 1)


@pytest.mark.unit
def test_batching_rejects_requests_over_max_batch_size(serve_in_process, model_versions, tmp_path):
    install_version(model_versions[0], tmp_path / "m", 1)
    params = tmp_path / "batching.config"
    params.write_text(
        "max_batch_size { value: 4 }\nbatch_timeout_micros { value: 0 }\nnum_batch_threads { value: 2 }\n"
    )
    server = serve_in_process(
        "--model_name=m",
        f"--model_base_path={tmp_path / 'm'}",
        "--enable_batching",
        f"--batching_parameters_file={params}",
    )
    server.wait_available("m", 1)
    predict, _ = stubs(server)
    assert predict.Predict(predict_request(images=IMAGES[:4]), timeout=30).outputs["classes"].int64_val
    error = rpc_error(predict.Predict, predict_request(images=IMAGES))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "Task size 6 is larger than maximum input batch size 4" in error.details()


HEALTH_CHECK = "/grpc.health.v1.Health/Check"


def health_check(server, service: str = "") -> bytes:
    """A raw grpc.health.v1 Check: the wire bytes, decoded by hand so the test shares no code with the
    server. HealthCheckResponse{status: SERVING} is b"\\x08\\x01", NOT_SERVING b"\\x08\\x02"."""
    request = b"\x0a" + bytes([len(service)]) + service.encode() if service else b""
    check = grpc.insecure_channel(server.target).unary_unary(HEALTH_CHECK)
    return check(request, timeout=10)


@pytest.mark.integration
def test_grpc_health_is_model_aware(serve_in_process, model_versions, tmp_path):
    install_version(model_versions[0], tmp_path / "m", 1)
    server = serve_in_process(
        "--model_name=m", f"--model_base_path={tmp_path / 'm'}", "--enable_grpc_healthcheck_service"
    )
    server.wait_available("m", 1)
    assert health_check(server) == b"\x08\x01" and health_check(server, "m") == b"\x08\x01"
    assert health_check(server, "tensorflow.serving.PredictionService") == b"\x08\x01"
    with pytest.raises(grpc.RpcError) as err:
        health_check(server, "nope")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    shutil.rmtree(tmp_path / "m" / "1")  # the only version goes: nothing left to serve
    server.wait_for(lambda: server.versions("m").get(1) == "END", "version 1 unloaded")
    assert health_check(server) == b"\x08\x02" and health_check(server, "m") == b"\x08\x02"
    install_version(model_versions[1], tmp_path / "m", 2)
    server.wait_available("m", 2)
    assert health_check(server) == b"\x08\x01"


@pytest.mark.unit
def test_grpc_health_is_off_by_default(running_m):
    with pytest.raises(grpc.RpcError) as err:
        health_check(running_m)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED, "as in TF Serving, only with the flag"


@pytest.mark.unit
def test_grpc_health_watch_streams_changes_and_ends_when_the_server_drains(serve_in_process, model_versions, tmp_path):
    install_version(model_versions[0], tmp_path / "m", 1)
    server = serve_in_process(
        "--model_name=m", f"--model_base_path={tmp_path / 'm'}", "--enable_grpc_healthcheck_service"
    )
    server.wait_available("m", 1)
    watch = grpc.insecure_channel(server.target).unary_stream("/grpc.health.v1.Health/Watch")
    stream = watch(b"\x0a\x01m", timeout=60)  # HealthCheckRequest{service: "m"}
    assert next(stream) == b"\x08\x01", "SERVING at once"
    stopping = threading.Thread(target=server.stop)
    stopping.start()
    assert next(stream) == b"\x08\x02", "NOT_SERVING when the drain begins"
    assert list(stream) == [], "then the stream ends, so the drain is not held up by it"
    stopping.join(timeout=60)
    assert server.exit_code == 0 and "stopped cleanly" in server.log()


@pytest.mark.unit
def test_failing_warmup_record_fails_the_load(serve_in_process, model_versions, tmp_path):
    from trainserve.layout import write_warmup_requests

    version = install_version(model_versions[0], tmp_path / "m", 1)
    write_warmup_requests(version, "m", {"images": np.zeros((2, 7, 7, 1), np.uint8)})  # wrong shape for this model
    server = serve_in_process("--model_name=m", f"--model_base_path={tmp_path / 'm'}")
    server.wait_for(lambda: "warmup record 0 failed" in server.log(), "the warmup failure")
    assert server.ended() is None, "a failed load is reported, not fatal"


@pytest.mark.unit
def test_rest_string_outputs_keep_their_shape():
    """A [N, K] DT_STRING output (class names per row) is N rows of K strings in JSON, not N x K flat."""
    from trainserve.serving.rest_api import json_value

    names = np.array([[b"setosa", b"versicolor"], [b"setosa", b"virginica"]], dtype=object)
    assert json_value(names) == [["setosa", "versicolor"], ["setosa", "virginica"]]
    assert json_value(np.array([b"a", b"b"], dtype=object)) == ["a", "b"]
    assert json_value(np.array([[1.5, 2.0]], np.float32)) == [[1.5, 2.0]]
