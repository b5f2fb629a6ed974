"""Requests TF Serving refuses are refused by serve-local too, with one line naming the input and what was
expected: REST bodies (tensorflow_serving/util/json_tensor.cc's rules) and TensorProtos over gRPC."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest

from conftest import DIRECT
from trainserve.protos import predict_pb2, types_pb2
from trainserve.protos.prediction_service_pb2_grpc import PredictionServiceStub
from trainserve.serving.rest_api import predict_json
from trainserve.serving.servables import ServingError
from trainserve.tensors import to_tensor_proto
from wire_model import broken, save_csv_model, save_wire_model, serve_models

pytestmark = pytest.mark.unit

ROW = {"a": 0.9, "b": 0.5, "kind": "p"}
WIRE_ROW = {"x": [1.0, 2.0, 3.0], "n": 4, "s": "abc"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("rest")
    server = serve_models(root, csv=save_csv_model(root / "csv" / "1"), w=save_wire_model(root / "w" / "1"))
    yield server
    assert server.stop() == 0


def post(server, model: str, body) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(f"{server.rest}/v1/models/{model}:predict", data, method="POST")
    try:
        with DIRECT.open(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def instances(*changes: dict) -> dict:
    """Instances of the CSV model: ROW with each change applied (a value of None removes the key)."""
    rows = [{k: v for k, v in (ROW | change).items() if v is not None} for change in changes]
    return {"instances": rows}


@pytest.mark.parametrize(
    "body, message",
    [
        pytest.param({"instances": [ROW, {"a": 0.2, "kind": "q"}]}, "instance 1 lacks 'b'", id="missing-key"),
        pytest.param(instances({"c": 1.0}), "instance 0 has unknown 'c'", id="extra-key"),
        pytest.param(
            {"inputs": {"a": [1.0], "b": [1.0], "kind": ["p"], "c": [1]}}, "has unknown 'c'", id="extra-key-columnar"
        ),
        pytest.param(
            instances({"a": "0.9"}),
            "input 'a' (instance 0): JSON value \"0.9\" is a string: expected float32",
            id="string-for-number",
        ),
        pytest.param(instances({"a": True}), "JSON value true is a boolean: expected float32", id="bool-for-number"),
        pytest.param(
            instances({}, {"b": {"v": 1}}),
            "input 'b' (instance 1): JSON value {\"v\": 1} is an object",
            id="nested-object",
        ),
        pytest.param({"instances": [ROW | {"b": None}]}, "JSON value null is null: expected float32", id="null"),
        pytest.param(instances({"a": {"b64": "AAAA"}}), '{"b64": ...} is for DT_STRING inputs', id="b64-for-number"),
        pytest.param(instances({"kind": 3}), "JSON value 3 is a number: expected a string", id="number-for-string"),
        pytest.param(instances({"kind": {"b64": "no!"}}), "is not base64", id="bad-base64"),
        pytest.param(instances({"a": 2**24 + 1}), "to float32 without loss of precision", id="lossy-int"),
        pytest.param(instances({"a": 1e39}), "to float32 without loss of precision", id="float-out-of-range"),
        pytest.param(instances({"a": [1.0]}, {}), "instance 1 has shape []: expected [1]", id="ragged-instances"),
        pytest.param({"instances": []}, '"instances" is a list: expected a non-empty list', id="no-instances"),
        pytest.param(
            {"instances": [1.0]}, "a list of values: expected objects with keys ['a', 'b', 'kind']", id="plain-list"
        ),
        pytest.param({"inputs": [1.0]}, '"inputs" is a list: expected an object', id="plain-inputs"),
        pytest.param({"instances": [ROW], "signature_name": 5}, '"signature_name" is not a string', id="signature"),
        pytest.param(b'{"instances": [' * 5000, "JSON parse error", id="deep-nesting"),
        pytest.param(b"{", "JSON parse error", id="not-json"),
        pytest.param(
            b'{"inputs": {"b": [1], "kind": ["p"], "a": ' + b"[" * 70 + b"]" * 70 + b"}}",
            "input 'a' (\"inputs\"): lists nested deeper than 64",
            id="too-many-dimensions",
        ),
    ],
)
def test_malformed_bodies_are_refused_with_the_input_and_what_was_expected(served, body, message):
    status, answer = post(served, "csv", body)
    assert status == 400 and message in answer["error"], (status, answer)
    assert "\n" not in answer["error"]


@pytest.mark.parametrize(
    "row, message",
    [
        pytest.param(WIRE_ROW | {"x": [1.0, 2.0]}, "instance 1 has shape [2]: expected [3]", id="ragged-rows"),
        pytest.param(WIRE_ROW | {"x": [1.0, [2.0], 3.0]}, "ragged lists", id="ragged-depth"),
        pytest.param(WIRE_ROW | {"n": 1.5}, "JSON value 1.5 is a number: expected int64", id="float-for-int"),
        pytest.param(WIRE_ROW | {"n": 2**63}, "out of range: expected int64", id="int64-range"),
        pytest.param(WIRE_ROW | {"s": "\ud800"}, "is not valid Unicode", id="lone-surrogate"),
    ],
)
def test_rows_must_agree_in_shape_and_type(served, row, message):
    status, answer = post(served, "w", {"instances": [WIRE_ROW, row]})
    assert status == 400 and message in answer["error"], (status, answer)


def test_an_instance_that_lacks_a_column_is_refused_not_answered_as_missing(served):
    """The issue's case: the CSV model reads NaN as "missing", so an instance without `b` got another answer."""
    status, answer = post(served, "csv", {"instances": [ROW, {"a": 0.2, "kind": "q"}]})
    assert status == 400 and answer == {"error": "instance 1 lacks 'b': expected keys ['a', 'b', 'kind']"}
    status, answer = post(served, "csv", instances({"a": 0.2, "kind": "q"}))
    assert status == 200 and answer["predictions"] == [pytest.approx(1.2)]


def test_base64_strings_are_decoded_and_bytes_come_back_as_base64(served):
    """TF Serving's REST rule (g3doc/api_rest.md): {"b64": ...} carries bytes both ways; an output whose name
    ends in _bytes is always base64, others are text unless the bytes are not UTF-8."""
    raw = b"\xff\x00p"
    body = {"instances": [WIRE_ROW | {"s": {"b64": base64.b64encode(raw).decode()}}, WIRE_ROW | {"s": "p"}]}
    status, answer = post(served, "w", body)
    assert status == 200, answer
    first, second = answer["predictions"]
    assert first["echo"] == first["raw_bytes"] == {"b64": base64.b64encode(raw).decode()}
    assert first["count"] == 4 + len(raw), "the server saw the decoded bytes"
    assert second["echo"] == "p" and second["raw_bytes"] == {"b64": "cA=="}
    status, same = post(served, "csv", instances({"kind": {"b64": "cA"}}))  # "p", padding left out
    assert status == 200 and same == post(served, "csv", instances({}))[1]


def test_row_answers_need_one_batch_size_across_outputs():
    """TF Serving refuses to write rows from outputs without a common first dimension (INVALID_ARGUMENT)."""
    with pytest.raises(ServingError) as err:
        predict_json({"scalar": np.float32(1.0), "rows": np.zeros(2, np.float32)}, row=True)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and "'scalar' has no batch dimension" in str(err.value)
    with pytest.raises(ServingError, match="different batch sizes"):
        predict_json({"a": np.zeros(2), "b": np.zeros(3)}, row=True)
    assert predict_json({"a": np.float32(1.0), "b": np.zeros(3)}, row=False) == {
        "outputs": {"a": 1.0, "b": [0.0, 0.0, 0.0]}
    }


def test_a_content_length_that_is_not_a_number_is_refused(served):
    request = urllib.request.Request(f"{served.rest}/v1/models/csv:predict", b"{}", method="POST")
    request.add_unredirected_header("Content-Length", "ten")
    with pytest.raises(urllib.error.HTTPError) as err:
        DIRECT.open(request, timeout=30)
    assert err.value.code == 400 and "Content-Length 'ten'" in json.loads(err.value.read())["error"]


X, N, S = np.ones((1, 3), np.float32), np.array([4], np.int64), np.array([b"abc"], dtype=object)


@pytest.mark.parametrize(
    "key, proto, message",
    [
        pytest.param(
            "x",
            broken(X, tensor_content=b"\0" * 10),
            "x: tensor_content holds 10 bytes: expected 12",
            id="content-length",
        ),
        pytest.param(
            "s", broken(S, tensor_content=b"abc"), "DT_STRING cannot travel as tensor_content", id="string-content"
        ),
        pytest.param(
            "n",
            broken(N, as_values=True, dims=[-1]),
            "n: tensor_shape [-1] has a negative dimension",
            id="negative-dim",
        ),
        pytest.param(
            "x", broken(X, as_values=True, dims=[2**40, 2**40]), "expected at most 2147483647", id="huge-shape"
        ),
        pytest.param(
            "n",
            broken(N, as_values=True, float_val=[1.0]),
            "DT_INT64 values travel in int64_val: found float_val",
            id="val-field-of-another-dtype",
        ),
        pytest.param("x", broken(X, as_values=True, float_val=[1.0]), "holds 4 values: expected 3", id="val-count"),
        pytest.param("x", broken(X, dtype=999), "tensor dtype DataType 999 is not supported", id="unknown-dtype"),
        pytest.param("x", broken(X, dtype=types_pb2.DT_BFLOAT16), "DT_BFLOAT16 is not supported", id="bfloat16"),
    ],
)
def test_tensor_protos_that_do_not_decode_are_invalid_argument_naming_the_input(served, key, proto, message):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "w"
    for name, array in {"x": X, "n": N, "s": S}.items():
        request.inputs[name].CopyFrom(proto if name == key else to_tensor_proto(array))
    with pytest.raises(grpc.RpcError) as err:
        PredictionServiceStub(grpc.insecure_channel(served.target)).Predict(request, timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert err.value.details().startswith(f"tensor parsing error: {key}: ") and message in err.value.details()
