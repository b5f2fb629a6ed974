"""numpy <-> tensorflow.TensorProto, both encodings TF Serving uses, without importing TensorFlow.

Clients send `tensor_content` (raw little-endian bytes: microseconds to build). Real TF Serving answers
with repeated `*_val` fields unless started with --enable_serialization_as_tensor_content
(tensorflow/serving#1276), so decoding handles both, and serve-local answers in `*_val` form as the
real server does.

Both kinds of message work: trainserve.protos' (the eval client, serve-local) and TensorFlow's own. They
are different classes with the same fields, so decoding reads either, and encoding fills the message it is
given (`into=request.inputs[key]`, which also saves a copy) or makes a trainserve.protos one. Decoding
builds numpy arrays straight from the bytes (`np.frombuffer`, no copy), never TensorFlow objects: serve-local
does it once per request.
"""

from __future__ import annotations

import math

import numpy as np

from trainserve.errors import TrainserveError
from trainserve.protos import tensor_pb2, types_pb2

_TO_DTYPE = {
    np.dtype(np.float32): types_pb2.DT_FLOAT,
    np.dtype(np.float64): types_pb2.DT_DOUBLE,
    np.dtype(np.float16): types_pb2.DT_HALF,
    np.dtype(np.int8): types_pb2.DT_INT8,
    np.dtype(np.int16): types_pb2.DT_INT16,
    np.dtype(np.int32): types_pb2.DT_INT32,
    np.dtype(np.int64): types_pb2.DT_INT64,
    np.dtype(np.uint8): types_pb2.DT_UINT8,
    np.dtype(np.uint16): types_pb2.DT_UINT16,
    np.dtype(np.uint32): types_pb2.DT_UINT32,
    np.dtype(np.uint64): types_pb2.DT_UINT64,
    np.dtype(np.bool_): types_pb2.DT_BOOL,
}
_FROM_DTYPE = {v: k for k, v in _TO_DTYPE.items()}
# Which repeated field holds values of each dtype (tensor.proto). half_val holds float16 bit patterns.
_VAL_FIELD = {
    types_pb2.DT_FLOAT: "float_val",
    types_pb2.DT_DOUBLE: "double_val",
    types_pb2.DT_HALF: "half_val",
    types_pb2.DT_INT8: "int_val",
    types_pb2.DT_INT16: "int_val",
    types_pb2.DT_INT32: "int_val",
    types_pb2.DT_UINT8: "int_val",
    types_pb2.DT_UINT16: "int_val",
    types_pb2.DT_INT64: "int64_val",
    types_pb2.DT_UINT32: "uint32_val",
    types_pb2.DT_UINT64: "uint64_val",
    types_pb2.DT_BOOL: "bool_val",
    types_pb2.DT_STRING: "string_val",
}


def numpy_dtype(dtype_enum: int) -> np.dtype:
    if dtype_enum == types_pb2.DT_STRING:
        return np.dtype(object)
    if dtype_enum not in _FROM_DTYPE:
        raise TrainserveError(f"tensor dtype {types_pb2.DataType.Name(dtype_enum)} is not supported")
    return _FROM_DTYPE[dtype_enum]


def to_tensor_proto(array: np.ndarray, as_values: bool = False, into=None):
    """Encode as `tensor_content` bytes (fast, for requests) or repeated `*_val` (as TF Serving answers).

    `into`: an empty TensorProto of either kind to fill; by default a new trainserve.protos one. Returns it.
    """
    array = np.asarray(array)
    proto = tensor_pb2.TensorProto() if into is None else into
    if array.dtype.kind in "OSU":
        proto.dtype = types_pb2.DT_STRING
        _set_shape(proto, array)
        proto.string_val.extend(v if isinstance(v, bytes) else str(v).encode() for v in array.ravel())
        return proto
    if array.dtype not in _TO_DTYPE:
        raise TrainserveError(f"cannot send dtype {array.dtype}: expected one of {sorted(str(d) for d in _TO_DTYPE)}")
    dtype = _TO_DTYPE[array.dtype]
    proto.dtype = dtype
    _set_shape(proto, array)
    if not as_values:
        proto.tensor_content = np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes()
        return proto
    flat = array.ravel()
    if dtype == types_pb2.DT_HALF:
        flat = flat.view(np.uint16)
    getattr(proto, _VAL_FIELD[dtype]).extend(flat.tolist())
    return proto


def _set_shape(proto, array: np.ndarray) -> None:
    for size in array.shape:
        proto.tensor_shape.dim.add(size=size)


def from_tensor_proto(proto) -> np.ndarray:
    """Decode either encoding; a single `*_val` value fills the whole shape, as TensorFlow does."""
    shape = tuple([d.size for d in proto.tensor_shape.dim])
    dtype = numpy_dtype(proto.dtype)
    count = math.prod(shape)
    content = proto.tensor_content  # read once: each read of a bytes field makes a new bytes object
    if content:
        array = np.frombuffer(content, dtype.newbyteorder("<"))
        if array.size != count:
            raise TrainserveError(f"tensor_content holds {array.size} values: expected {count} for shape {list(shape)}")
        return array.astype(dtype, copy=False).reshape(shape)
    values = getattr(proto, _VAL_FIELD[proto.dtype])
    if proto.dtype == types_pb2.DT_STRING:
        array = np.array(list(values), dtype=object)
    elif proto.dtype == types_pb2.DT_HALF:
        array = np.array(values, np.uint16).view(np.float16)
    else:
        array = np.array(values, dtype)
    if array.size == count:
        return array.reshape(shape)
    if array.size == 1 or (array.size == 0 and count == 0):
        return np.full(shape, array[0] if array.size else 0, dtype)
    raise TrainserveError(f"tensor holds {array.size} values: expected {count} for shape {list(shape)}")
