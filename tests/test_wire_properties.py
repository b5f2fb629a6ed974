"""Property-based tests at the wire: generated TensorProtos and REST bodies, over real gRPC and HTTP sockets,
against a model (float32, int64 and string inputs) that serve-local serves in this process.

Every answer is OK with the numbers TensorFlow gives when it calls the SavedModel's signature directly, or a
client error (INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION; HTTP 400, 404); never UNKNOWN, INTERNAL or
500. A well-formed request is answered OK, and after every case a good request still gets the right answer.
Derandomized: CI sees the same cases on every run.
"""

from __future__ import annotations

import base64
import copy
import json
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
from google.protobuf.descriptor import FieldDescriptor as Field
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from conftest import DIRECT
from serving_fixtures import InProcessServer
from trainserve.protos import predict_pb2, tensor_pb2, types_pb2
from trainserve.protos.prediction_service_pb2_grpc import PredictionServiceStub
from trainserve.serving.rest_api import json_string, json_value
from trainserve.tensors import to_tensor_proto
from wire_model import save_wire_model

CLIENT_CODES = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION}
CLIENT_HTTP = {400, 404}
WIRE_SETTINGS = settings(
    max_examples=300, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck)
)
GOOD = {
    "x": np.array([[1.5, -2.0, 0.25]], np.float32),
    "n": np.array([7], np.int64),
    "s": np.array([b"caf\xc3\xa9"], dtype=object),
}


class Wire:
    """The server, a gRPC stub to it, and the SavedModel's signature called directly by TensorFlow."""

    def __init__(self, server: InProcessServer, signature):
        self.server, self.signature = server, signature
        self.stub = PredictionServiceStub(grpc.insecure_channel(server.target))

    def direct(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import tensorflow as tf

        return {k: v.numpy() for k, v in self.signature(**{k: tf.constant(v) for k, v in inputs.items()}).items()}

    def post(self, body: bytes) -> tuple[int, dict]:
        request = urllib.request.Request(self.server.rest + "/v1/models/w:predict", body, method="POST")
        try:
            with DIRECT.open(request, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    def check_still_serving(self) -> None:
        want = self.direct(GOOD)
        assert_same(decode_grpc(self.stub.Predict(grpc_request(tensors(GOOD)), timeout=30)), want)
        status, answer = self.post(json.dumps({"inputs": rest_columns(GOOD)}).encode())
        assert status == 200, answer
        assert_same(decode_rest(answer["outputs"]), want)


@pytest.fixture(scope="module")
def wire(tmp_path_factory):
    import tensorflow as tf

    version = tmp_path_factory.mktemp("wire") / "w" / "1"
    save_wire_model(version)
    server = InProcessServer("--model_name=w", f"--model_base_path={version.parent}")
    server.wait_available("w", 1)
    yield Wire(server, tf.saved_model.load(str(version)).signatures["serving_default"])
    assert server.stop() == 0


def assert_same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for key, expected in want.items():
        value = np.asarray(got[key])
        assert value.shape == expected.shape, (key, value.shape, expected.shape)
        if expected.dtype.kind == "f":
            np.testing.assert_allclose(value, expected, rtol=1e-6, equal_nan=True, err_msg=key)
        else:
            assert value.tolist() == expected.tolist(), key


# --- gRPC ---------------------------------------------------------------------------------------------------------

VAL_FIELDS = [f for f in tensor_pb2.TensorProto.DESCRIPTOR.fields if f.name.endswith("_val") and f.message_type is None]
FIELD_VALUES = {
    Field.TYPE_FLOAT: st.floats(width=32),
    Field.TYPE_DOUBLE: st.floats(),
    Field.TYPE_INT32: st.integers(-(2**31), 2**31 - 1),
    Field.TYPE_INT64: st.integers(-(2**63), 2**63 - 1),
    Field.TYPE_UINT32: st.integers(0, 2**32 - 1),
    Field.TYPE_UINT64: st.integers(0, 2**64 - 1),
    Field.TYPE_BOOL: st.booleans(),
    Field.TYPE_BYTES: st.binary(max_size=6),
}
# Every DataType (the _REF ones included) and numbers no release defines.
DTYPES = sorted(types_pb2.DataType.values()) + [999, -3]
DIMS = st.sampled_from([0, 1, 2, 3, -1, -7, 2**20, 2**31, 2**40, 2**62, 2**63 - 1])


@st.composite
def any_tensor(draw) -> tensor_pb2.TensorProto:
    """Any TensorProto: any dtype, dims zero, negative or huge, content of any length, any *_val field."""
    proto = tensor_pb2.TensorProto(dtype=draw(st.sampled_from(DTYPES)))
    proto.tensor_shape.unknown_rank = draw(st.integers(0, 9)) == 0
    for size in draw(st.lists(DIMS, max_size=3) | st.just([1] * 65)):  # numpy has at most 64 dimensions
        proto.tensor_shape.dim.add(size=size)
    encoding = draw(st.sampled_from(["content", "values", "both", "none"]))
    if encoding in ("content", "both"):
        proto.tensor_content = draw(st.binary(max_size=40))
    if encoding in ("values", "both"):
        field = draw(st.sampled_from(VAL_FIELDS))
        if field.is_repeated:
            getattr(proto, field.name).extend(draw(st.lists(FIELD_VALUES[field.type], max_size=7)))
        else:  # float8_val: one bytes field
            setattr(proto, field.name, draw(FIELD_VALUES[field.type]))
    return proto


def good_arrays(batch: int):
    strings = st.lists(st.binary(max_size=6), min_size=batch, max_size=batch)
    return st.fixed_dictionaries(
        {
            "x": arrays(np.float32, (batch, 3), elements=st.floats(width=32)),
            "n": arrays(np.int64, (batch,)),
            "s": strings.map(lambda values: np.array(values, dtype=object).reshape(batch)),
        }
    )


@st.composite
def good_tensor(draw, array: np.ndarray) -> tensor_pb2.TensorProto:
    """The array in either encoding (strings travel only as string_val)."""
    as_values = array.dtype == object or draw(st.booleans())
    return to_tensor_proto(array, as_values=as_values)


@st.composite
def predict_cases(draw) -> tuple[predict_pb2.PredictRequest, dict | None]:
    """A request, and the arrays it carries when it is well formed for the signature (None otherwise)."""
    arrays_ = draw(good_arrays(draw(st.integers(0, 3))))
    mode = draw(st.sampled_from(["valid", "one bad", "all random"]))
    tensors_ = {k: draw(good_tensor(v)) for k, v in arrays_.items()}
    if mode == "one bad":
        key = draw(st.sampled_from(sorted(arrays_)))
        bad = draw(st.sampled_from(["random", "other batch", "missing"]))
        if bad == "missing":
            del tensors_[key]
        elif bad == "other batch":
            tensors_[key] = draw(good_tensor(draw(good_arrays(draw(st.integers(0, 3))))[key]))
        else:
            tensors_[key] = draw(any_tensor())
    elif mode == "all random":
        tensors_ = {k: draw(any_tensor()) for k in arrays_}
    extra = draw(st.integers(0, 5)) == 0
    if extra:
        tensors_["extra"] = draw(any_tensor())
    model, signature = draw(
        st.sampled_from([("w", ""), ("w", "serving_default"), ("w", ""), ("nope", ""), ("w", "nope")])
    )
    request = grpc_request(tensors_, model, signature)
    return request, arrays_ if mode == "valid" and not extra and model == "w" and signature != "nope" else None


def tensors(arrays_: dict[str, np.ndarray]) -> dict:
    return {k: to_tensor_proto(v) for k, v in arrays_.items()}


def grpc_request(tensors_: dict, model: str = "w", signature: str = "") -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name, request.model_spec.signature_name = model, signature
    for key, proto in tensors_.items():
        request.inputs[key].CopyFrom(proto)
    return request


def decode_grpc(response) -> dict[str, np.ndarray]:
    """TensorFlow's own decoding of the answer (not trainserve's)."""
    import tensorflow as tf

    return {k: tf.make_ndarray(v) for k, v in response.outputs.items()}


def sent_arrays(request) -> dict[str, np.ndarray]:
    """What the request carries, as TensorFlow decodes it."""
    import tensorflow as tf
    from tensorflow.core.framework import tensor_pb2 as tf_tensor_pb2

    return {
        k: tf.make_ndarray(tf_tensor_pb2.TensorProto.FromString(v.SerializeToString()))
        for k, v in request.inputs.items()
    }


@pytest.mark.integration
@WIRE_SETTINGS
@given(case=predict_cases())
def test_every_tensor_proto_gets_the_models_answer_or_a_client_error(wire, case):
    import tensorflow as tf

    request, well_formed = case
    try:
        response = wire.stub.Predict(request, timeout=30)
    except grpc.RpcError as err:
        event(f"{err.code().name}, well formed: {well_formed is not None}")
        assert err.code() in CLIENT_CODES, (err.code(), err.details())
        if well_formed is not None:  # refused: only because TensorFlow itself refuses these arrays
            with pytest.raises(tf.errors.InvalidArgumentError):
                wire.direct(well_formed)
    else:
        event(f"OK, well formed: {well_formed is not None}")
        assert_same(decode_grpc(response), wire.direct(sent_arrays(request)))
    wire.check_still_serving()


# --- REST ---------------------------------------------------------------------------------------------------------


def rest_columns(arrays_: dict[str, np.ndarray], as_b64: bool = False) -> dict:
    return {"x": arrays_["x"].tolist(), "n": arrays_["n"].tolist(), "s": [json_string(v, as_b64) for v in arrays_["s"]]}


def decode_rest(columns: dict) -> dict[str, np.ndarray]:
    """An answer's columns as arrays: strings from text or {"b64": ...}; `raw_bytes` must be base64."""
    decoded = {}
    for key, values in columns.items():
        if key in ("echo", "raw_bytes"):
            assert key == "echo" or all(isinstance(v, dict) for v in values), values
            strings = [base64.b64decode(v["b64"]) if isinstance(v, dict) else v.encode() for v in values]
            decoded[key] = np.array(strings + [None], dtype=object)[:-1]  # stays 1-D even for equal lengths
        else:
            decoded[key] = np.array(values, np.int64 if key == "count" else np.float32)
    return decoded


def rest_outputs(answer: dict) -> dict[str, np.ndarray]:
    if "outputs" in answer:
        return decode_rest(answer["outputs"])
    return decode_rest({k: [row[k] for row in answer["predictions"]] for k in answer["predictions"][0]})


def get_row(body: dict, key: str, i: int):
    return body["instances"][i][key] if "instances" in body else body["inputs"][key][i]


def set_row(body: dict, key: str, i: int, value) -> None:
    if "instances" in body:
        body["instances"][i][key] = value
    else:
        body["inputs"][key][i] = value


GOOD_ROW = {"x": [1.0, 2.0, 3.0], "n": 1, "s": "a"}
BAD_BODIES = [
    [],
    "x",
    {},
    {"instances": []},
    {"instances": {}},
    {"instances": [1.0, 2.0]},
    {"instances": [[1.0, 2.0, 3.0]]},
    {"inputs": [1.0]},
    {"inputs": {"b64": "AAAA"}},
    {"instances": [{"b64": "AAAA"}]},
    {"instances": [GOOD_ROW], "inputs": {"x": [[1.0, 2.0, 3.0]], "n": [1], "s": ["a"]}},
    {"instances": [GOOD_ROW], "signature_name": 5},
    {"instances": [GOOD_ROW], "signature_name": "nope"},
    {"instances": [GOOD_ROW, [1.0, 2.0, 3.0]]},
    {"instances": [GOOD_ROW, {"b64": "AAAA"}]},
]


class Nested(bytes):
    """A body nested deeper than any parser's recursion (printed short when hypothesis reports it)."""

    def __repr__(self) -> str:
        return f"Nested({len(self)} bytes)"


BAD_RAW = [b"", b"{", b"\xff\xfe", b"[1, 2", Nested(b'{"instances": [' * 3000)]
# Values where a number (x's elements, n) or a string (s) belongs: wrong JSON types, nesting, base64 in the
# wrong place, numbers the dtype cannot hold.
BAD_X = ["1.5", None, True, {"a": 1.0}, {"b64": "AAAA"}, [1.0], 2**24 + 1, 1e39]
BAD_N = ["7", None, 1.5, True, {"b64": "AAAA"}, [1], 2**63, -(2**63) - 1, {"n": 1}]
BAD_S = [1, None, True, {"a": "b"}, {"b64": "not base64!"}, {"b64": 1}, {"b64": "QQ==", "x": 1}, ["a"], "\ud800"]
BAD_X_ROWS = [{"a": 1.0}, "1,2,3", None, [[1.0, 2.0, 3.0]], 5.0, [1.0, 2.0], [1.0, 2.0, 3.0, 4.0], []]


@st.composite
def mutated(draw, body: dict):
    """The body made invalid in one way TF Serving refuses."""
    body = copy.deepcopy(body)
    rows = len(body["instances"]) if "instances" in body else len(body["inputs"]["n"])
    row = draw(st.integers(0, rows - 1))
    how = draw(st.sampled_from(["missing key", "extra key", "bad x", "bad x row", "bad n", "bad s", "body", "raw"]))
    if how == "missing key":
        key = draw(st.sampled_from("xns"))
        del (body["instances"][row] if "instances" in body else body["inputs"])[key]
    elif how == "extra key":
        (body["instances"][row] if "instances" in body else body["inputs"])["z"] = draw(st.sampled_from([1.0, "z"]))
    elif how == "bad x":
        get_row(body, "x", row)[draw(st.integers(0, 2))] = draw(st.sampled_from(BAD_X))
    elif how == "bad x row":
        set_row(body, "x", row, draw(st.sampled_from(BAD_X_ROWS)))
    elif how in ("bad n", "bad s"):
        set_row(body, how[-1], row, draw(st.sampled_from(BAD_N if how == "bad n" else BAD_S)))
    elif how == "body":
        return json.dumps(draw(st.sampled_from(BAD_BODIES))).encode()
    else:
        return draw(st.sampled_from(BAD_RAW))
    return json.dumps(body).encode()


def with_int_floats(rows: list) -> list:
    """x's whole numbers written as JSON integers, as clients do; TF Serving takes them below 2**24."""
    return [[int(v) if v.is_integer() and abs(v) < 2**24 else v for v in row] for row in rows]


@st.composite
def rest_cases(draw) -> tuple[bytes, dict | None]:
    """A predict body, and the arrays it carries when it is well formed (None: it must be refused)."""
    batch = draw(st.integers(1, 3))
    arrays_ = draw(good_arrays(batch))
    columns = rest_columns(arrays_, as_b64=draw(st.booleans()))
    if draw(st.booleans()):
        columns["x"] = with_int_floats(columns["x"])
    columnar = draw(st.booleans())
    body = (
        {"inputs": columns}
        if columnar
        else {"instances": [{k: v[i] for k, v in columns.items()} for i in range(batch)]}
    )
    if draw(st.sampled_from(["well formed", "mutated", "mutated"])) == "well formed":
        return json.dumps(body).encode(), arrays_
    return draw(mutated(body)), None


@pytest.mark.integration
@WIRE_SETTINGS
@given(case=rest_cases())
def test_every_rest_body_gets_the_models_answer_or_a_client_error(wire, case):
    body, well_formed = case
    status, answer = wire.post(body)
    event(f"HTTP {status}")
    if well_formed is None:
        assert status in CLIENT_HTTP, (status, answer)
        assert set(answer) == {"error"} and "\n" not in answer["error"], answer
    else:
        assert status == 200, answer
        assert_same(rest_outputs(answer), wire.direct(well_formed))
    wire.check_still_serving()


@pytest.mark.unit
def test_fixed_width_bytes_outputs_are_written_as_json_strings():
    """A scalar string output reaches the REST answer as numpy bytes_ (dtype S), not objects: text or base64 all
    the same (it was a 500, 'bytes is not JSON serializable')."""
    assert json.dumps(json_value(np.array(b"arrived"))) == '"arrived"'
    assert json.dumps(json_value(np.array([b"a", b"\xff"]))) == '["a", {"b64": "/w=="}]'
    assert json.dumps(json_value(np.array([b"a"]), "raw_bytes")) == '[{"b64": "YQ=="}]'
