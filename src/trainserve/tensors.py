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


# The largest tensor a request may decode to: the largest gRPC message TF Serving accepts (INT32_MAX bytes).
# Checked before anything is allocated, so a shape of 2**40 elements is refused, not attempted.
MAX_TENSOR_BYTES = 2**31 - 1
MAX_RANK = 64  # numpy's limit (TensorFlow's is 254)


def dtype_name(dtype_enum: int) -> str:
    """DT_FLOAT, ...; a number no DataType names (protobuf enums are open) is written as such."""
    try:
        return types_pb2.DataType.Name(dtype_enum)
    except ValueError:
        return f"DataType {dtype_enum}"


def numpy_dtype(dtype_enum: int) -> np.dtype:
    if dtype_enum == types_pb2.DT_STRING:
        return np.dtype(object)
    if dtype_enum not in _FROM_DTYPE:
        supported = ", ".join(dtype_name(d) for d in sorted(_VAL_FIELD))
        raise TrainserveError(f"tensor dtype {dtype_name(dtype_enum)} is not supported: expected one of {supported}")
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
    """Decode either encoding; a single `*_val` value fills the whole shape, as TensorFlow does.

    Everything is checked before anything is allocated: the dtype, the shape (no negative or unknown
    dimension, at most MAX_TENSOR_BYTES), and that the values are where the dtype keeps them and as many
    as the shape holds. TensorFlow pads missing `*_val` values with the last one and ignores fields of other
    dtypes; a request like that is refused here instead, since its answer would not be for what was meant.
    """
    dtype = numpy_dtype(proto.dtype)
    shape = _checked_shape(proto.tensor_shape, dtype)
    content = proto.tensor_content  # read once: each read of a bytes field makes a new bytes object
    fields = [f.name for f, _ in proto.ListFields() if f.name.endswith("_val")]
    if content:
        if proto.dtype == types_pb2.DT_STRING:
            raise TrainserveError("DT_STRING cannot travel as tensor_content: expected string_val")
        if fields:
            raise TrainserveError(f"both tensor_content and {fields[0]} are set: expected one of them")
        return _from_content(content, dtype, shape)
    expected = _VAL_FIELD[proto.dtype]
    wrong = [f for f in fields if f != expected]
    if wrong:
        raise TrainserveError(f"{dtype_name(proto.dtype)} values travel in {expected}: found {wrong[0]}")
    return _from_values(getattr(proto, expected), proto.dtype, dtype, shape)


def _checked_shape(tensor_shape, dtype: np.dtype) -> tuple[int, ...]:
    if tensor_shape.unknown_rank:
        raise TrainserveError("tensor_shape has unknown_rank: expected a fully defined shape")
    shape = tuple([d.size for d in tensor_shape.dim])
    if len(shape) > MAX_RANK:
        raise TrainserveError(f"tensor_shape has {len(shape)} dimensions: expected at most {MAX_RANK}")
    if any(size < 0 for size in shape):
        raise TrainserveError(f"tensor_shape {list(shape)} has a negative dimension: expected sizes >= 0")
    # Zero dimensions aside: numpy refuses [0, 2**31, 2**31] too, though it holds nothing.
    size = math.prod(max(d, 1) for d in shape) * dtype.itemsize
    if size > MAX_TENSOR_BYTES:
        raise TrainserveError(
            f"tensor_shape {list(shape)} of {dtype.name} needs {size} bytes (zero dimensions aside): expected at "
            f"most {MAX_TENSOR_BYTES}"
        )
    return shape


def _from_content(content: bytes, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    count = math.prod(shape)
    if len(content) != count * dtype.itemsize:
        raise TrainserveError(
            f"tensor_content holds {len(content)} bytes: expected {count * dtype.itemsize} "
            f"({count} {dtype.name} values of {dtype.itemsize} bytes for shape {list(shape)})"
        )
    return np.frombuffer(content, dtype.newbyteorder("<")).astype(dtype, copy=False).reshape(shape)


def _from_values(values, dtype_enum: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    count = math.prod(shape)
    if len(values) not in (count, 1):
        raise TrainserveError(
            f"tensor holds {len(values)} values: expected {count} for shape {list(shape)} (or 1 to fill it)"
        )
    if dtype_enum == types_pb2.DT_STRING:
        array = np.array(list(values), dtype=object)
    else:
        array = _numbers(values, dtype_enum, dtype)
    if array.size == count:
        return array.reshape(shape)
    return np.full(shape, array[0], dtype)


# Dtypes whose values travel in a wider int32 field (half_val: float16 bit patterns), so a value can be out of
# range. TensorFlow would truncate it, and numpy converting a protobuf container wraps it silently.
_NARROW = {
    types_pb2.DT_INT8: np.int8,
    types_pb2.DT_INT16: np.int16,
    types_pb2.DT_UINT8: np.uint8,
    types_pb2.DT_UINT16: np.uint16,
    types_pb2.DT_HALF: np.uint16,
}


def _numbers(values, dtype_enum: int, dtype: np.dtype) -> np.ndarray:
    if dtype_enum not in _NARROW:
        return np.array(values, dtype)
    wide, target = np.array(values, np.int64), _NARROW[dtype_enum]
    info = np.iinfo(target)
    outside = (wide < info.min) | (wide > info.max)
    if outside.any():
        what = "float16 bit patterns" if dtype_enum == types_pb2.DT_HALF else f"{dtype.name} values"
        raise TrainserveError(
            f"{_VAL_FIELD[dtype_enum]} holds {wide[outside][0]}: expected {what} in [{info.min}, {info.max}]"
        )
    narrow = wide.astype(target)
    return narrow.view(np.float16) if dtype_enum == types_pb2.DT_HALF else narrow
