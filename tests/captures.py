"""Captured traffic written as capture writes it (TFRecord frames of PredictionLog records, files named
`<prefix>-<host>-<pid>-<UTC time>-<seq5>.tfrecord`), so the readers' tests need no capture process."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trainserve.protos import prediction_log_pb2
from trainserve.tensors import to_tensor_proto
from trainserve.tfrecord import frame


def prediction_log(
    model: str,
    inputs: dict[str, np.ndarray],
    version: int = 1,
    request_id: str = "",
    timestamp_s: int = 1_790_000_000,
    outputs: dict[str, np.ndarray] | None = None,
    signature: str = "serving_default",
) -> bytes:
    """One serialized PredictionLog, as the capture contract has it."""
    entry = prediction_log_pb2.PredictionLog()
    meta = entry.log_metadata
    meta.model_spec.name, meta.model_spec.signature_name = model, signature
    meta.model_spec.version.value = version
    meta.sampling_config.sampling_rate = 1.0
    meta.timestamp_secs, meta.request_origin = timestamp_s, request_id
    request = entry.predict_log.request
    request.model_spec.name, request.model_spec.signature_name = model, signature
    for key, array in inputs.items():
        to_tensor_proto(np.asarray(array), into=request.inputs[key])
    response = entry.predict_log.response
    response.model_spec.name = model
    response.model_spec.version.value = version
    for key, array in (outputs or {}).items():
        to_tensor_proto(np.asarray(array), into=response.outputs[key])
    return entry.SerializeToString()


def capture_name(seq: int, prefix: str = "capture", host: str = "host-a", pid: int = 41) -> str:
    return f"{prefix}-{host}-{pid}-20261126T120000-{seq:05d}.tfrecord"


def write_capture(path: Path, records: list[bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(frame(r) for r in records))
    return path


def write_batches(directory: Path, model: str, batches: list[dict[str, np.ndarray]], per_file: int = 4) -> list[str]:
    """`batches` as one record each, `per_file` records a file; returns the request ids, in order."""
    ids = [f"req-{i:06d}" for i in range(len(batches))]
    records = [
        prediction_log(model, b, request_id=i, timestamp_s=1_790_000_000 + n)
        for n, (i, b) in enumerate(zip(ids, batches))
    ]
    for start in range(0, len(records), per_file):
        write_capture(directory / capture_name(start // per_file), records[start : start + per_file])
    return ids
