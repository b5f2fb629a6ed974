"""One captured call as a serialized `PredictionLog`, built from the request's and response's wire bytes.

The PredictLog's request and response are embedded exactly as they crossed the wire (a proto message field is its
serialized bytes behind a tag and a length), so what replay compares with is what the client got, byte for byte,
and the proxy never decodes a call to log it. `PredictionLog.FromString` reads the result like any other record.
"""

from __future__ import annotations

import time
import uuid

from trainserve.protos import logging_pb2

# Field numbers in tensorflow_serving/apis/prediction_log.proto: PredictionLog.log_metadata = 1,
# PredictionLog.predict_log = 6; PredictLog.request = 1, PredictLog.response = 2.
_LOG_METADATA, _PREDICT_LOG, _REQUEST, _RESPONSE = 1, 6, 1, 2
_LENGTH_DELIMITED = 2
REQUEST_ID_HEADER = "x-request-id"  # gRPC metadata key and HTTP header a client may send; else one is made up


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def length_delimited(number: int, payload: bytes) -> bytes:
    """One length-delimited field (a message, bytes or a string) as it sits on the wire: tag, length, payload."""
    return _varint(number << 3 | _LENGTH_DELIMITED) + _varint(len(payload)) + payload


def request_id(given: str | None) -> str:
    """The client's `x-request-id` when it sent one, else a fresh uuid4 (hex): every record can be joined later."""
    return given if given else uuid.uuid4().hex


def log_metadata(
    name: str,
    version: int | None,
    signature: str,
    sampling_rate: float,
    request: str,
    timestamp: float | None = None,
) -> logging_pb2.LogMetadata:
    """The record's metadata: the model and the version that answered, the sampling rate, the time (whole
    seconds, as TF Serving's field holds) and the request id (LogMetadata has no request-id field: it rides in
    request_origin)."""
    metadata = logging_pb2.LogMetadata()
    metadata.model_spec.name = name
    metadata.model_spec.signature_name = signature
    if version is not None:
        metadata.model_spec.version.SetInParent()  # present even for version 0
        metadata.model_spec.version.value = version
    metadata.sampling_config.sampling_rate = sampling_rate
    metadata.timestamp_secs = int(time.time() if timestamp is None else timestamp)
    metadata.request_origin = request
    return metadata


def prediction_log(metadata: logging_pb2.LogMetadata | bytes, request: bytes, response: bytes) -> bytes:
    """A serialized PredictionLog {log_metadata, predict_log {request, response}} from serialized parts."""
    if not isinstance(metadata, bytes):
        metadata = metadata.SerializeToString()
    predict_log = length_delimited(_REQUEST, request) + length_delimited(_RESPONSE, response)
    return length_delimited(_LOG_METADATA, metadata) + length_delimited(_PREDICT_LOG, predict_log)
