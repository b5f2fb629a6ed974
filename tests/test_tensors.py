"""TensorProto encoding: what clients send (tensor_content) and what TF Serving answers (*_val)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from trainserve.errors import TrainserveError
from trainserve.tensors import from_tensor_proto, to_tensor_proto

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
    with pytest.raises(TrainserveError, match="expected 15 for shape"):
        from_tensor_proto(proto)
