"""trainserve.protos against the real TF Serving protos: the same bytes both ways, side by side in one process.

trainserve builds every TF Serving message from trainserve.protos (no TensorFlow, no serving wheel); TF
Serving and its clients use the wheel's. Every message trainserve sends, reads or writes is checked here
both ways, byte for byte (tensors for every dtype, in both encodings), config files as text too, and the
generated servicers answer the wheel's own client stubs over a real socket.
"""

from __future__ import annotations

import subprocess
import sys
from concurrent import futures

import grpc
import numpy as np
import pytest
from google.protobuf import any_pb2, text_format
from tensorflow.core.framework import tensor_pb2 as real_tensor_pb2
from tensorflow.core.framework import types_pb2 as real_types_pb2
from tensorflow_serving.apis import get_model_metadata_pb2 as real_metadata_pb2
from tensorflow_serving.apis import get_model_status_pb2 as real_status_pb2
from tensorflow_serving.apis import predict_pb2 as real_predict_pb2
from tensorflow_serving.apis import prediction_log_pb2 as real_log_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc as real_prediction_grpc
from tensorflow_serving.config import model_server_config_pb2 as real_config_pb2

from conftest import REPO
from trainserve.client import Target
from trainserve.protos import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_server_config_pb2,
    predict_pb2,
    prediction_log_pb2,
    prediction_service_pb2_grpc,
    tensor_pb2,
    types_pb2,
)
from trainserve.tensors import _TO_DTYPE, from_tensor_proto, to_tensor_proto

# One array per dtype trainserve sends or decodes (tensors._TO_DTYPE), plus strings, with awkward values.
ARRAYS = {
    **{dtype.name: np.arange(6).reshape(2, 3).astype(dtype) for dtype in _TO_DTYPE},
    "float32-extremes": np.array([np.finfo(np.float32).max, -0.0, np.inf, 1e-45], np.float32),
    "int64-extremes": np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max], np.int64),
    "uint64-extremes": np.array([np.iinfo(np.uint64).max], np.uint64),
    "float16-extremes": np.array([65504, -6.1e-5], np.float16),
    "string": np.array([b"cat", "d\xf6g".encode(), b""], dtype=object),
    "scalar": np.array(2.5, np.float64),
    "empty": np.zeros((0, 4), np.uint8),
}


def crossed(message, other_class):
    """`message` serialized, parsed as `other_class`, and serialized again: must be the same bytes."""
    wire = message.SerializeToString(deterministic=True)
    other = other_class.FromString(wire)
    assert other.SerializeToString(deterministic=True) == wire
    return other


@pytest.mark.unit
def test_the_dtype_enum_is_tensorflows():
    assert dict(types_pb2.DataType.items()) == dict(real_types_pb2.DataType.items())


@pytest.mark.unit
@pytest.mark.parametrize("as_values", [False, True], ids=["tensor_content", "val-fields"])
@pytest.mark.parametrize("name", ARRAYS)
def test_tensors_cross_byte_for_byte(name, as_values):
    array = ARRAYS[name]
    ours = to_tensor_proto(array, as_values=as_values)
    theirs = crossed(ours, real_tensor_pb2.TensorProto)
    assert isinstance(ours, tensor_pb2.TensorProto) and theirs.dtype == ours.dtype
    real = to_tensor_proto(array, as_values=as_values, into=real_tensor_pb2.TensorProto())
    assert real.SerializeToString(deterministic=True) == ours.SerializeToString(deterministic=True)
    back = crossed(real, tensor_pb2.TensorProto)
    for decoded in (from_tensor_proto(back), from_tensor_proto(theirs)):
        assert decoded.dtype == (object if name == "string" else array.dtype) and decoded.shape == array.shape
        np.testing.assert_array_equal(decoded, array)


@pytest.mark.unit
@pytest.mark.parametrize("version", [None, 0, 7], ids=["newest", "version-0", "version-7"])
def test_predict_request_crosses_with_model_spec_and_filter(version):
    request = predict_pb2.PredictRequest()
    Target("digits", version=version, label=None if version is not None else "stable").fill(request.model_spec)
    to_tensor_proto(ARRAYS["uint8"], into=request.inputs["images"])
    to_tensor_proto(ARRAYS["int64"], into=request.inputs["ids"])
    request.output_filter.extend(["probabilities", "classes"])
    theirs = crossed(request, real_predict_pb2.PredictRequest)
    assert theirs.model_spec.HasField("version") == (version is not None), "a set version, even 0, is sent"
    assert theirs.model_spec.version_label == ("stable" if version is None else "")
    np.testing.assert_array_equal(from_tensor_proto(theirs.inputs["images"]), ARRAYS["uint8"])


@pytest.mark.unit
def test_predict_response_from_the_server_parses():
    real = real_predict_pb2.PredictResponse()
    real.model_spec.name, real.model_spec.signature_name = "digits", "serving_default"
    real.model_spec.version.value = 3
    for key, name in (("probabilities", "float32"), ("classes", "int64"), ("half", "float16")):
        to_tensor_proto(ARRAYS[name], as_values=True, into=real.outputs[key])
    ours = crossed(real, predict_pb2.PredictResponse)
    assert ours.model_spec.version.value == 3
    for key, name in (("probabilities", "float32"), ("classes", "int64"), ("half", "float16")):
        np.testing.assert_array_equal(from_tensor_proto(ours.outputs[key]), ARRAYS[name])


@pytest.mark.unit
def test_model_metadata_signature_map_unpacks_from_its_any():
    """TF Serving packs a SignatureDefMap in an Any: the type URL names tensorflow.serving.SignatureDefMap."""
    signatures = real_metadata_pb2.SignatureDefMap()
    sig = signatures.signature_def["serving_default"]
    sig.method_name = "tensorflow/serving/predict"
    sig.inputs["images"].name, sig.inputs["images"].dtype = "serving_default_images:0", real_types_pb2.DT_UINT8
    for size in (-1, 8, 8, 1):
        sig.inputs["images"].tensor_shape.dim.add(size=size)
    sig.outputs["probabilities"].dtype = real_types_pb2.DT_FLOAT
    sig.outputs["probabilities"].tensor_shape.unknown_rank = True
    real = real_metadata_pb2.GetModelMetadataResponse()
    real.model_spec.name = "digits"
    packed = any_pb2.Any()
    packed.Pack(signatures)
    real.metadata["signature_def"].CopyFrom(packed)
    ours = crossed(real, get_model_metadata_pb2.GetModelMetadataResponse)
    assert ours.metadata["signature_def"].type_url == "type.googleapis.com/tensorflow.serving.SignatureDefMap"
    unpacked = get_model_metadata_pb2.SignatureDefMap()
    assert ours.metadata["signature_def"].Unpack(unpacked)
    assert unpacked.SerializeToString(deterministic=True) == signatures.SerializeToString(deterministic=True)
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    Target("digits", version=2).fill(request.model_spec)
    crossed(request, real_metadata_pb2.GetModelMetadataRequest)


@pytest.mark.unit
def test_model_status_crosses():
    request = get_model_status_pb2.GetModelStatusRequest()
    Target("digits", label="canary").fill(request.model_spec)
    crossed(request, real_status_pb2.GetModelStatusRequest)
    real = real_status_pb2.GetModelStatusResponse()
    for version, state in ((1, "UNLOADING"), (2, "AVAILABLE")):
        status = real.model_version_status.add(version=version)
        status.state = real_status_pb2.ModelVersionStatus.State.Value(state)
        status.status.error_code, status.status.error_message = 5, "gone"
    ours = crossed(real, get_model_status_pb2.GetModelStatusResponse)
    assert [s.state == get_model_status_pb2.ModelVersionStatus.AVAILABLE for s in ours.model_version_status] == [
        False,
        True,
    ]


@pytest.mark.unit
def test_same_names_as_tensorflow_in_a_pool_of_their_own():
    assert predict_pb2.PredictRequest.DESCRIPTOR.full_name == real_predict_pb2.PredictRequest.DESCRIPTOR.full_name
    assert predict_pb2.PredictRequest is not real_predict_pb2.PredictRequest
    assert predict_pb2.DESCRIPTOR.pool is not real_predict_pb2.DESCRIPTOR.pool


@pytest.mark.unit
def test_importing_them_imports_no_tensorflow():
    code = (
        "import sys\n"
        "from trainserve.protos import model_service_pb2_grpc, prediction_service_pb2_grpc, prediction_log_pb2\n"
        "from trainserve.protos import model_server_config_pb2, session_bundle_config_pb2, monitoring_config_pb2\n"
        "import trainserve.tensors, trainserve.savedmodel\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'tensorflow_serving')], sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.integration  # the generator imports the serving wheel, hence TensorFlow
def test_checked_in_modules_are_what_make_protos_generates(tmp_path):
    """Hand-edit a generated module, or bump tensorflow-serving-api without `make protos`, and this fails."""
    proc = subprocess.run(
        [sys.executable, REPO / "scripts" / "generate_protos.py", tmp_path], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    package = REPO / "src" / "trainserve" / "protos"
    generated = sorted(p.name for p in tmp_path.glob("*.py"))
    assert generated == sorted(p.name for p in package.glob("*_pb2*.py")), "run `make protos`"
    for name in generated:
        assert (tmp_path / name).read_text() == (package / name).read_text(), f"{name} is stale: run `make protos`"


MODEL_CONFIG = """
model_config_list {
  config {
    name: "digits"
    base_path: "/models/digits"
    model_platform: "tensorflow"
    model_version_policy { specific { versions: 3 versions: 4 } }
    version_labels { key: "stable" value: 3 }
    version_labels { key: "candidate" value: 4 }
  }
}
"""


@pytest.mark.unit
def test_model_server_config_reads_and_writes_as_tf_serving_does():
    """The config file serve-local reads and rollout rewrites: same bytes, same text as the wheel's message."""
    real = text_format.Parse(MODEL_CONFIG, real_config_pb2.ModelServerConfig())
    ours = text_format.Parse(MODEL_CONFIG, model_server_config_pb2.ModelServerConfig())
    assert ours.SerializeToString(deterministic=True) == real.SerializeToString(deterministic=True)
    assert text_format.MessageToString(ours) == text_format.MessageToString(real)
    crossed(ours, real_config_pb2.ModelServerConfig)
    assert list(ours.model_config_list.config[0].model_version_policy.specific.versions) == [3, 4]


@pytest.mark.unit
def test_warmup_prediction_log_crosses():
    ours = prediction_log_pb2.PredictionLog()
    ours.predict_log.request.model_spec.name = "digits"
    to_tensor_proto(ARRAYS["uint8"], into=ours.predict_log.request.inputs["images"])
    theirs = crossed(ours, real_log_pb2.PredictionLog)
    assert theirs.WhichOneof("log_type") == "predict_log"
    np.testing.assert_array_equal(from_tensor_proto(theirs.predict_log.request.inputs["images"]), ARRAYS["uint8"])


@pytest.mark.unit
def test_warmup_file_reads_back_with_tensorflows_own_classes(tmp_path):
    """What TF Serving replays: the records parsed by the wheel's PredictionLog, tensors by tf.make_ndarray."""
    import tensorflow as tf

    from trainserve.layout import warmup_path, write_warmup_requests

    images = np.arange(5 * 3 * 3, dtype=np.uint8).reshape(5, 3, 3, 1)
    words = np.array(["a", "é", "", "long word", "z"])
    assert write_warmup_requests(tmp_path, "m", {"images": images, "words": words}, batch_sizes=(1, 4)) == 2
    records = [
        real_log_pb2.PredictionLog.FromString(r.numpy()) for r in tf.data.TFRecordDataset(str(warmup_path(tmp_path)))
    ]
    for size, record in zip((1, 4), records, strict=True):
        request = record.predict_log.request
        assert (request.model_spec.name, request.model_spec.signature_name) == ("m", "serving_default")
        np.testing.assert_array_equal(tf.make_ndarray(request.inputs["images"]), images[:size])
        assert tf.make_ndarray(request.inputs["words"]).tolist() == [w.encode() for w in words[:size]]


class EchoPredictions(prediction_service_pb2_grpc.PredictionServiceServicer):
    def Predict(self, request, context):
        response = predict_pb2.PredictResponse()
        response.model_spec.CopyFrom(request.model_spec)
        response.outputs["echo"].CopyFrom(request.inputs["x"])
        return response


@pytest.mark.unit
def test_generated_servicer_answers_the_wheels_client_over_a_socket():
    server = grpc.server(futures.ThreadPoolExecutor(2))
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(EchoPredictions(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = real_prediction_grpc.PredictionServiceStub(channel)
            request = real_predict_pb2.PredictRequest()
            request.model_spec.name = "m"
            to_tensor_proto(ARRAYS["float32"], into=request.inputs["x"])
            response = stub.Predict(request, timeout=10)
            assert response.model_spec.name == "m"
            np.testing.assert_array_equal(from_tensor_proto(response.outputs["echo"]), ARRAYS["float32"])
            with pytest.raises(grpc.RpcError) as err:  # not overridden: UNIMPLEMENTED, as grpcio-tools' servicers
                prediction_service_pb2_grpc.PredictionServiceStub(channel).Classify(
                    classification_pb2.ClassificationRequest(), timeout=10
                )
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        server.stop(None)
