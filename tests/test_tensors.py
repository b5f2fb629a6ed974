"""TensorProto encoding: what clients send (tensor_content) and what TF Serving answers (*_val)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from trainserve.errors import TrainserveError
from trainserve.tensors import from_tensor_proto, to_tensor_proto
from wire_model import broken

pytestmark = pytest.mark.unit

ARRAYS = {
    "uint8": np.arange(24, dtype=np.uint8).reshape(2, 3, 4),
    "float32": np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3),
    "float16": np.array([0.5, -2.25, 65504], np.float16),
    "int64": np.array([-(2**40), 0, 2**40], np.int64),
    "int32": np.array([[-5, 7]], np.int32),
    "bool": np.array([True, False]),
    "double": np.array([np.pi], np.float64),
    "scalar": np.array(3.5, np.float32),
    "empty": np.zeros((0, 3), np.float32),
}


@pytest.mark.parametrize("as_values", [False, True], ids=["tensor_content", "val-fields"])
@pytest.mark.parametrize("name", ARRAYS)
def test_round_trip_both_encodings(name, as_values):
    array = ARRAYS[name]
    proto = to_tensor_proto(array, as_values=as_values)
    assert bool(proto.tensor_content) == (not as_values and array.size > 0)
    back = from_tensor_proto(proto)
    assert back.dtype == array.dtype and back.shape == array.shape
    np.testing.assert_array_equal(back, array)
    np.testing.assert_array_equal(tf.make_ndarray(proto), array), "TensorFlow reads our protos the same way"


@pytest.mark.parametrize("name", ARRAYS)
def test_decodes_what_tensorflow_encodes(name):
    np.testing.assert_array_equal(from_tensor_proto(tf.make_tensor_proto(ARRAYS[name])), ARRAYS[name])


def test_single_value_fills_the_shape_and_strings_round_trip():
    proto = tf.make_tensor_proto(7.0, shape=[2, 2])  # TensorFlow's compact form: one float_val
    np.testing.assert_array_equal(from_tensor_proto(proto), np.full((2, 2), 7.0, np.float32))
    words = np.array([b"cat", b"dog"], dtype=object)
    assert list(from_tensor_proto(to_tensor_proto(words))) == [b"cat", b"dog"]


def test_wrong_value_count_is_an_error():
    proto = to_tensor_proto(np.zeros((2, 3), np.float32))
    proto.tensor_shape.dim[0].size = 5
    with pytest.raises(TrainserveError, match=r"expected 60 \(15 float32 values of 4 bytes for shape \[5, 3\]\)"):
        from_tensor_proto(proto)


FLOATS = np.zeros((2, 3), np.float32)


@pytest.mark.parametrize(
    "proto, message",
    [
        pytest.param(
            broken(FLOATS, tensor_content=b"\0" * 10),
            "holds 10 bytes: expected 24 (6 float32 values",
            id="content-not-a-multiple",
        ),
        pytest.param(broken(FLOATS, dims=[5, 3]), "holds 24 bytes: expected 60 (15 float32 values", id="content-count"),
        pytest.param(
            broken(np.array([b"ab"], dtype=object), tensor_content=b"ab"),
            "DT_STRING cannot travel as tensor_content: expected string_val",
            id="string-content",
        ),
        pytest.param(broken(FLOATS, float_val=[1.0]), "both tensor_content and float_val are set", id="two-encodings"),
        pytest.param(broken(FLOATS, as_values=True, dims=[-1, 3]), "[-1, 3] has a negative dimension", id="negative"),
        pytest.param(
            broken(FLOATS, as_values=True, dims=[2**62, 4]),
            "needs 73786976294838206464 bytes (zero dimensions aside): expected at most",
            id="huge",
        ),
        pytest.param(broken(FLOATS, as_values=True, dims=[2**29]), "needs 2147483648 bytes", id="just-too-big"),
        pytest.param(
            broken(FLOATS, as_values=True, dims=[1] * 65), "has 65 dimensions: expected at most 64", id="rank"
        ),
        pytest.param(
            broken(FLOATS, as_values=True, dims=[0, 2**31, 2**31]),
            "[0, 2147483648, 2147483648] of float32 needs 18446744073709551616 bytes (zero dimensions aside)",
            id="empty-but-huge",
        ),
        pytest.param(
            broken(FLOATS, as_values=True, int64_val=[1]),
            "DT_FLOAT values travel in float_val: found int64_val",
            id="val-field-of-another-dtype",
        ),
        pytest.param(
            broken(FLOATS, as_values=True, float_val=[1.0]),
            "holds 7 values: expected 6 for shape [2, 3]",
            id="val-count",
        ),
        pytest.param(
            broken(np.zeros(2, np.uint8), as_values=True, dims=[3], int_val=[300]),
            "int_val holds 300: expected uint8 values in [0, 255]",
            id="int-val-range",
        ),
        pytest.param(
            broken(np.zeros(1, np.float16), as_values=True, dims=[2], half_val=[70000]),
            "half_val holds 70000: expected float16 bit patterns",
            id="half-val-range",
        ),
        pytest.param(broken(FLOATS, dtype=999), "DataType 999 is not supported: expected one of DT_FLOAT", id="dtype"),
        pytest.param(broken(FLOATS, dtype=14), "DT_BFLOAT16 is not supported", id="bfloat16"),
    ],
)
def test_malformed_protos_are_refused_with_what_was_expected(proto, message):
    with pytest.raises(TrainserveError) as err:
        from_tensor_proto(proto)
    assert message in str(err.value)


def test_a_refused_shape_allocates_nothing():
    """2 GiB of float32 from one float_val: refused by arithmetic, before numpy allocates anything."""
    import tracemalloc

    proto = broken(np.zeros(1, np.float32), as_values=True, dims=[2**29])
    tracemalloc.start()
    try:
        with pytest.raises(TrainserveError):
            from_tensor_proto(proto)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**20, peak
