"""TensorFlow's run-time errors keep their code, as TF Serving passes a run's Status through; REST maps every
code to HTTP as TF Serving does; `trainserve verify` on a model that loads but fails when run says so in one
line."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from conftest import assert_one_line_error, run_cli
from trainserve.protos import predict_pb2
from trainserve.protos.prediction_service_pb2_grpc import PredictionServiceStub
from trainserve.savedmodel import LoadedModel, RunError
from trainserve.serving.rest_api import HTTP_STATUS
from trainserve.serving.servables import ServingError, tf_errors
from trainserve.tensors import to_tensor_proto
from wire_model import save_failing_model, serve_models


@pytest.fixture(scope="module")
def failing(tmp_path_factory):
    return save_failing_model(tmp_path_factory.mktemp("failing") / "f" / "1")


@pytest.mark.unit
def test_run_errors_carry_tensorflows_code_and_the_ops_own_message(failing, tmp_path):
    model = LoadedModel(failing)
    with pytest.raises(RunError) as err:
        model.run("serving_default", {"x": np.zeros(1, np.float32)})
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert str(err.value) == "signature 'serving_default' failed: inverse of x : Tensor had Inf values"
    with pytest.raises(RunError) as err:
        model.run("read", {"path": np.array(str(tmp_path / "nope").encode(), dtype=object)})
    assert err.value.code == grpc.StatusCode.NOT_FOUND.value[0] and "nope" in str(err.value)


@pytest.mark.unit
@pytest.mark.parametrize("code", [c for c in grpc.StatusCode if c != grpc.StatusCode.OK], ids=lambda c: c.name)
def test_tf_errors_keep_every_code(code):
    with pytest.raises(ServingError) as err, tf_errors("serving_default"):
        raise RunError("signature 'serving_default' failed: it broke", code.value[0])
    assert err.value.code == code and str(err.value) == "signature 'serving_default' failed: it broke"


@pytest.mark.unit
def test_every_code_has_tf_servings_http_status():
    """ToHTTPStatusCode (model_servers/http_server.cc): no code falls through to a default."""
    assert set(HTTP_STATUS) == set(grpc.StatusCode) - {grpc.StatusCode.OK}
    assert {c.name: int(s) for c, s in HTTP_STATUS.items()} == {
        "CANCELLED": 499,
        "UNKNOWN": 500,
        "INVALID_ARGUMENT": 400,
        "DEADLINE_EXCEEDED": 504,
        "NOT_FOUND": 404,
        "ALREADY_EXISTS": 409,
        "PERMISSION_DENIED": 403,
        "RESOURCE_EXHAUSTED": 429,
        "FAILED_PRECONDITION": 400,
        "ABORTED": 409,
        "OUT_OF_RANGE": 400,
        "UNIMPLEMENTED": 501,
        "INTERNAL": 500,
        "UNAVAILABLE": 503,
        "DATA_LOSS": 500,
        "UNAUTHENTICATED": 401,
    }


@pytest.mark.unit
def test_served_model_errors_keep_their_code_on_both_apis(failing, tmp_path):
    server = serve_models(tmp_path, f=failing)
    try:
        stub = PredictionServiceStub(grpc.insecure_channel(server.target))
        for path, code in [
            (tmp_path / "nope", grpc.StatusCode.NOT_FOUND),
            (tmp_path, grpc.StatusCode.FAILED_PRECONDITION),
        ]:
            request = predict_pb2.PredictRequest()
            request.model_spec.name, request.model_spec.signature_name = "f", "read"
            to_tensor_proto(np.array(str(path).encode(), dtype=object), into=request.inputs["path"])
            with pytest.raises(grpc.RpcError) as err:
                stub.Predict(request, timeout=30)
            assert err.value.code() == code, err.value.details()
            assert err.value.details().startswith("signature 'read' failed: ")
        status, answer = server.post("/v1/models/f:predict", {"instances": [1.0, 0.0]})
        assert status == 400 and answer == {
            "error": "signature 'serving_default' failed: inverse of x : Tensor had Inf values"
        }
        status, answer = server.post("/v1/models/f:predict", {"signature_name": "read", "inputs": str(tmp_path / "no")})
        assert status == 404 and "no" in answer["error"]
    finally:
        assert server.stop() == 0


@pytest.mark.unit
def test_the_gate_reports_a_model_that_fails_when_run(failing):
    from trainserve.training.gate import check_on_cpu

    result = check_on_cpu(failing)  # zeros shaped like the input: 1/0
    assert not result.ok and result.reason == "signature 'serving_default' failed: inverse of x : Tensor had Inf values"


@pytest.mark.integration
def test_verify_prints_one_line_for_a_model_that_fails_when_run(failing):
    proc = run_cli("verify", failing)
    assert_one_line_error(proc, "fails the CPU gate", "signature 'serving_default' failed", "Tensor had Inf values")
