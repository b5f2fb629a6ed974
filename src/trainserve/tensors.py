"""numpy <-> tensorflow.TensorProto, both encodings TF Serving uses.

Clients send `tensor_content` (raw little-endian bytes: microseconds to build). Real TF Serving answers
with repeated `*_val` fields unless started with --enable_serialization_as_tensor_content
(tensorflow/serving#1276), so decoding handles both, and serve-local answers in `*_val` form as the
real server does.
"""

from __future__ import annotations

import numpy as np
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2

from trainserve.errors import TrainserveError

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


def _shape(array: np.ndarray) -> tensor_shape_pb2.TensorShapeProto:
    return tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in array.shape])


def to_tensor_proto(array: np.ndarray, as_values: bool = False) -> tensor_pb2.TensorProto:
    """Encode as `tensor_content` bytes (fast, for requests) or repeated `*_val` (as TF Serving answers)."""
    array = np.asarray(array)
    if array.dtype.kind in "OSU":
        values = [v if isinstance(v, bytes) else str(v).encode() for v in array.ravel()]
        return tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, tensor_shape=_shape(array), string_val=values)
    if array.dtype not in _TO_DTYPE:
        raise TrainserveError(f"cannot send dtype {array.dtype}: expected one of {sorted(str(d) for d in _TO_DTYPE)}")
    dtype = _TO_DTYPE[array.dtype]
    proto = tensor_pb2.TensorProto(dtype=dtype, tensor_shape=_shape(array))
    if not as_values:
        proto.tensor_content = np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes()
        return proto
    flat = array.ravel()
    if dtype == types_pb2.DT_HALF:
        flat = flat.view(np.uint16)
    getattr(proto, _VAL_FIELD[dtype]).extend(flat.tolist())
    return proto


def from_tensor_proto(proto: tensor_pb2.TensorProto) -> np.ndarray:
    """Decode either encoding; a single `*_val` value fills the whole shape, as TensorFlow does."""
    shape = tuple(d.size for d in proto.tensor_shape.dim)
    dtype = numpy_dtype(proto.dtype)
    count = int(np.prod(shape, dtype=np.int64))
    if proto.tensor_content:
        array = np.frombuffer(proto.tensor_content, dtype.newbyteorder("<"))
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
