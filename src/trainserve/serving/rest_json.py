"""REST predict bodies -> numpy arrays in the signature's dtypes, by TF Serving's rules
(tensorflow_serving/util/json_tensor.cc, g3doc/api_rest.md).

A body TF Serving refuses is refused here too, as INVALID_ARGUMENT (HTTP 400) with one line naming the input
and what was expected: instances that lack a key or add one, ragged lists, a value of the wrong JSON type (a
string where a number belongs, null, a nested object, a boolean for a number), a number the dtype cannot hold
exactly, `{"b64": ...}` for an input that is not DT_STRING. DT_STRING values are JSON strings (sent as their
UTF-8 bytes) or `{"b64": "<standard base64>"}` (sent as the decoded bytes).

Where TF Serving would answer for something other than what was sent, the body is refused instead: an
integer out of an int8/int16/uint8 input's range (TF Serving truncates it) and an extra key in a columnar
`inputs` object (TF Serving ignores it).
"""

from __future__ import annotations

import base64
import binascii
import json

import grpc
import numpy as np

from trainserve.serving.servables import ServingError
from trainserve.tensors import MAX_RANK

# Integers a float holds exactly, as TF Serving counts them (IsLosslessDecimal: 2**digits - 1).
EXACT_INTS = {np.dtype(np.float32): 2**24 - 1, np.dtype(np.float64): 2**53 - 1}
# The dtypes TF Serving converts JSON to (AddValueToTensor); others answer UNIMPLEMENTED, as there.
INTEGERS = {np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint32, np.uint64)}


class JsonTensorError(Exception):
    """A JSON value that is not a tensor of the input's dtype; the caller adds which input it was."""

    def __init__(self, message: str, code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT):
        super().__init__(message)
        self.code = code


def rest_inputs(body: dict, inputs_spec: dict) -> tuple[dict[str, np.ndarray], bool]:
    """Row (`instances`) or columnar (`inputs`) request body -> (arrays in the signature's dtypes, row?)."""
    if ("instances" in body) == ("inputs" in body):
        raise _refused('expected exactly one of "instances" or "inputs"')
    if "instances" in body:
        return row_inputs(body["instances"], inputs_spec), True
    return columnar_inputs(body["inputs"], inputs_spec), False


def row_inputs(instances, inputs_spec: dict) -> dict[str, np.ndarray]:
    """A list of instances: bare values for a single-input signature, else objects with every input's key."""
    names = sorted(inputs_spec)
    if not isinstance(instances, list) or not instances:
        raise _refused(f'"instances" is {_json_type(instances)}: expected a non-empty list')
    if not is_named(instances[0]):
        if len(names) != 1:
            raise _refused(f'"instances" is a list of values: expected objects with keys {names}')
        name = names[0]
        return {name: _stack(name, [_tensor(name, inputs_spec, v, f"instance {i}") for i, v in enumerate(instances)])}
    columns: dict[str, list[np.ndarray]] = {name: [] for name in names}
    for i, instance in enumerate(instances):
        if not is_named(instance):
            raise _refused(f"instance {i} is {_json_type(instance)}: expected an object with keys {names}")
        _check_keys(instance, names, f"instance {i}")
        for name in names:
            columns[name].append(_tensor(name, inputs_spec, instance[name], f"instance {i}"))
    return {name: _stack(name, tensors) for name, tensors in columns.items()}


def columnar_inputs(columns, inputs_spec: dict) -> dict[str, np.ndarray]:
    """An object of whole input tensors, or one bare tensor for a single-input signature."""
    names = sorted(inputs_spec)
    if not is_named(columns):
        if len(names) != 1:
            raise _refused(f'"inputs" is {_json_type(columns)}: expected an object with keys {names}')
        return {names[0]: _tensor(names[0], inputs_spec, columns, '"inputs"')}
    _check_keys(columns, names, '"inputs"')
    return {name: _tensor(name, inputs_spec, columns[name], '"inputs"') for name in names}


def is_named(value) -> bool:
    """An object keyed by input names; `{"b64": "..."}` is a value, not a name."""
    return isinstance(value, dict) and not _is_b64(value)


def _is_b64(value) -> bool:
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("b64"), str)


def _check_keys(obj: dict, names: list[str], where: str) -> None:
    missing, extra = sorted(set(names) - set(obj)), sorted(set(obj) - set(names))
    if missing or extra:
        wrong = ", ".join(
            ([f"lacks {', '.join(map(repr, missing))}"] if missing else [])
            + ([f"has unknown {', '.join(map(repr, extra))}"] if extra else [])
        )
        raise _refused(f"{where} {wrong}: expected keys {names}")


def _tensor(name: str, inputs_spec: dict, value, where: str) -> np.ndarray:
    try:
        return json_tensor(value, inputs_spec[name].dtype)
    except JsonTensorError as exc:
        raise ServingError(exc.code, f"input {name!r} ({where}): {exc}") from None


def _stack(name: str, tensors: list[np.ndarray]) -> np.ndarray:
    """Instances batched along a new first dimension: each must have the first one's shape."""
    first = tensors[0].shape
    for i, tensor in enumerate(tensors):
        if tensor.shape != first:
            raise _refused(f"input {name!r}: instance {i} has shape {list(tensor.shape)}: expected {list(first)}")
    return np.stack(tensors)


def json_tensor(value, dtype: np.dtype) -> np.ndarray:
    """A JSON value (nested lists of equal lengths, or one value) as an array of `dtype`."""
    shape = _dense_shape(value)
    # numpy lays out the lists (in C, fast); where they are ragged it stops early and keeps lists as elements.
    grid = np.array(value, dtype=object)
    leaves = grid.ravel().tolist()
    types = set(map(type, leaves))
    if grid.shape != shape or list in types:
        raise JsonTensorError(
            f"ragged lists: expected each list as long as the first at its depth (shape {list(shape)})"
        )
    return _leaf_array(leaves, types, dtype).reshape(shape)


def _dense_shape(value) -> tuple[int, ...]:
    """The shape the first element at each depth implies (as TF Serving reads it)."""
    shape = []
    while isinstance(value, list):
        shape.append(len(value))
        if len(shape) > MAX_RANK:
            raise JsonTensorError(f"lists nested deeper than {MAX_RANK}: expected at most {MAX_RANK} dimensions")
        if not value:
            break
        value = value[0]
    return tuple(shape)


def _leaf_array(leaves: list, types: set[type], dtype: np.dtype) -> np.ndarray:
    if dtype.kind == "O":
        return np.array([_string(v) for v in leaves], dtype=object)
    if dtype == np.bool_:
        _check_types(leaves, types, (bool,), dtype)
    elif dtype in INTEGERS:
        _check_types(leaves, types, (int,), dtype)
        _check_range(leaves, dtype)
    elif dtype in EXACT_INTS:
        _check_types(leaves, types, (int, float), dtype)
        _check_exact(leaves, dtype, types)
    else:
        raise JsonTensorError(
            f"TF Serving's REST API has no JSON form for {dtype.name}: use gRPC", grpc.StatusCode.UNIMPLEMENTED
        )
    return np.array(leaves, dtype)


def _check_types(leaves: list, types: set[type], allowed: tuple[type, ...], dtype: np.dtype) -> None:
    """`type(v) in allowed`, not isinstance: JSON's true is a Python int too, and is no number here."""
    if not types <= set(allowed):
        bad = next(v for v in leaves if type(v) not in allowed)
        hint = ' ({"b64": ...} is for DT_STRING inputs)' if _is_b64(bad) else ""
        raise JsonTensorError(f"JSON value {_short(bad)} is {_json_type(bad)}: expected {dtype.name}{hint}")


def _check_range(leaves: list, dtype: np.dtype) -> None:
    info = np.iinfo(dtype)
    if leaves and not (info.min <= min(leaves) and max(leaves) <= info.max):
        bad = next(v for v in leaves if not info.min <= v <= info.max)
        raise JsonTensorError(f"JSON value {bad} is out of range: expected {dtype.name} in [{info.min}, {info.max}]")


def _check_exact(leaves: list, dtype: np.dtype, types: set[type]) -> None:
    """Integers the float holds exactly; finite numbers within its range (infinities and NaN pass, as there)."""
    limit = EXACT_INTS[dtype]
    if int in types and max(abs(v) for v in leaves if type(v) is int) > limit:
        _lossy(next(v for v in leaves if type(v) is int and abs(v) > limit), dtype)
    if float in types and dtype == np.float32:
        values = np.array(leaves, np.float64)  # exact: the integers among them are within 2**24
        over = np.isfinite(values) & (np.abs(values) > np.finfo(np.float32).max)
        if over.any():
            _lossy(leaves[int(np.argmax(over))], dtype)


def _lossy(value, dtype: np.dtype) -> None:
    raise JsonTensorError(f"cannot convert JSON value {_short(value)} to {dtype.name} without loss of precision")


def _string(value) -> bytes:
    if type(value) is str:
        try:
            return value.encode()
        except UnicodeEncodeError:  # a lone surrogate ("\ud800"): JSON escapes it, UTF-8 has no bytes for it
            raise JsonTensorError(f"JSON string {_short(value)} is not valid Unicode: expected text") from None
    if _is_b64(value):
        text = value["b64"]
        try:
            return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
        except binascii.Error:
            raise JsonTensorError(
                f"{_short(value)} is not base64: expected standard base64 (A-Z a-z 0-9 + /)"
            ) from None
    if isinstance(value, dict):
        raise JsonTensorError(f'JSON object {_short(value)}: expected a string or {{"b64": "<base64>"}}')
    raise JsonTensorError(f"JSON value {_short(value)} is {_json_type(value)}: expected a string")


def _json_type(value) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return names.get(type(value), "null")


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _refused(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.INVALID_ARGUMENT, message)
