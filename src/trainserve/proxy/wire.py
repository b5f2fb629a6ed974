"""The model_spec of a Predict call read and rewritten on the wire, without decoding the tensors.

The proxy forwards bytes. To route a request it needs only its `model_spec` (which model, which label), and to
count an answer by version only the answer's `model_spec.version`; both are one field among the top-level ones, so
they are found by walking the tags and skipping every other field's bytes (a batch of 256 images is skipped, not
parsed). Field numbers from tensorflow_serving/apis/predict.proto: PredictRequest.model_spec = 1,
PredictResponse.model_spec = 2. A message field that occurs more than once is merged, as protobuf parsers do.
"""

from __future__ import annotations

from trainserve.protos import model_pb2
from trainserve.traffic.records import length_delimited

REQUEST_SPEC, RESPONSE_SPEC = 1, 2
MAX_VERSION = 2**63 - 1  # model_spec.version is an Int64Value: a larger version cannot be sent
_VARINT, _FIXED64, _LENGTH_DELIMITED, _FIXED32 = 0, 1, 2, 5


class WireError(ValueError):
    """Bytes that are not a protobuf message."""


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise WireError("truncated varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def _fields(data: bytes):
    """(field number, start of the field's tag, start of its payload, end) for each top-level field."""
    at = 0
    while at < len(data):
        start = at
        tag, at = _varint(data, at)
        number, kind = tag >> 3, tag & 7
        if kind == _VARINT:
            _, end = _varint(data, at)
        elif kind == _LENGTH_DELIMITED:
            length, at = _varint(data, at)
            end = at + length
        elif kind in (_FIXED64, _FIXED32):
            end = at + (8 if kind == _FIXED64 else 4)
        else:
            raise WireError(f"wire type {kind}")
        if end > len(data):
            raise WireError("truncated field")
        yield number, start, at, end
        at = end


def _spec(data: bytes, number: int) -> model_pb2.ModelSpec:
    spec = model_pb2.ModelSpec()
    for field, _, payload, end in _fields(data):
        if field == number:
            spec.MergeFromString(data[payload:end])
    return spec


def request_spec(request: bytes) -> model_pb2.ModelSpec:
    """A Predict request's model_spec (raises WireError on bytes that are not a message)."""
    return _spec(request, REQUEST_SPEC)


def response_spec(response: bytes) -> model_pb2.ModelSpec:
    """A Predict response's model_spec (raises WireError on bytes that are not a message)."""
    return _spec(response, RESPONSE_SPEC)


def answered_version(response: bytes) -> int | None:
    """The version a Predict response says answered it, None when the server left it out."""
    try:
        spec = response_spec(response)
    except (WireError, ValueError):
        return None
    return spec.version.value if spec.HasField("version") else None


def with_version(request: bytes, spec: model_pb2.ModelSpec, version: int) -> bytes:
    """`request` addressed to `version` instead of its label: the model_spec replaced, every other byte kept.
    Raises WireError for a version model_spec cannot hold (the routing file refuses those before)."""
    if not 0 <= version <= MAX_VERSION:
        raise WireError(f"version {version}: expected an integer from 0 to {MAX_VERSION} (int64)")
    rewritten = model_pb2.ModelSpec()
    rewritten.CopyFrom(spec)
    rewritten.version.value = version  # the oneof: the label is cleared
    return _with_spec(request, rewritten)


def with_label(request: bytes, spec: model_pb2.ModelSpec, label: str) -> bytes:
    """`request` addressed to the version label `label`: the model_spec replaced, every other byte kept."""
    rewritten = model_pb2.ModelSpec()
    rewritten.CopyFrom(spec)
    rewritten.version_label = label  # the oneof: a version is cleared
    return _with_spec(request, rewritten)


def _with_spec(request: bytes, spec: model_pb2.ModelSpec) -> bytes:
    kept = [request[start:end] for field, start, _, end in _fields(request) if field != REQUEST_SPEC]
    return length_delimited(REQUEST_SPEC, spec.SerializeToString()) + b"".join(kept)
