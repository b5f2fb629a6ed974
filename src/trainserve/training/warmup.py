"""`train --warmup-from CAPTURES`: the version's warmup requests are real captured requests, the shapes and mixes
clients send (as TF Serving's warmup guide recommends), instead of held-out examples at batch sizes 1, 8 and 32.

A warmup request that fails fails the version's load in TF Serving, so only captured requests the new version's
signature takes are kept: the same inputs as the data, each with the data's dtype and example shape. They are
read and checked before training (none fitting is one error line), and written, up to TF Serving's 1000, as
PredictionLog records whose request names this model and `serving_default`, with no version or output filter.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from trainserve.data import Dataset
from trainserve.errors import TrainserveError
from trainserve.layout import DEFAULT_SIGNATURE, MAX_WARMUP_RECORDS, warmup_path
from trainserve.protos import prediction_log_pb2, types_pb2
from trainserve.tensors import numpy_dtype
from trainserve.tfrecord import frame
from trainserve.traffic.reader import read_capture

log = logging.getLogger(__name__)


def captured_warmup(warmup_from: Path | None, model_name: str, dataset: Dataset) -> list[bytes] | None:
    """The serialized warmup records from the capture (None without --warmup-from)."""
    if warmup_from is None:
        return None
    wanted = {name: (_kind(array.dtype), tuple(array.shape[1:])) for name, array in dataset.train.items()}
    kept, refused = [], 0
    for record in read_capture([warmup_from], model_name):
        got = {
            k: (_tensor_kind(v.dtype), tuple(d.size for d in v.tensor_shape.dim[1:]))
            for k, v in record.request.inputs.items()
        }
        if got != wanted or any(not v.tensor_shape.dim for v in record.request.inputs.values()):
            refused += 1
            continue
        entry = prediction_log_pb2.PredictionLog()
        request = entry.predict_log.request
        request.inputs.MergeFrom(record.request.inputs)
        request.model_spec.name, request.model_spec.signature_name = model_name, DEFAULT_SIGNATURE
        kept.append(entry.SerializeToString())
        if len(kept) == MAX_WARMUP_RECORDS:
            break
    said = ", ".join(f"{k} {kind} {list(shape)}" for k, (kind, shape) in sorted(wanted.items()))
    if not kept:
        raise TrainserveError(
            f"--warmup-from {warmup_from}: none of {refused} captured request(s) of model {model_name!r} fits the "
            f"data's inputs ({said}): expected requests this model's signature takes"
        )
    log.info(
        "warmup: %d captured requests (%d left out: other inputs, dtypes or shapes than %s)", len(kept), refused, said
    )
    return kept


def _kind(dtype: np.dtype) -> str:
    return "string" if dtype.kind in "OSU" else np.dtype(dtype).name


def _tensor_kind(dtype_enum: int) -> str:
    try:
        return "string" if dtype_enum == types_pb2.DT_STRING else numpy_dtype(dtype_enum).name
    except TrainserveError:  # a dtype no data holds (bfloat16, complex...)
        return f"dtype {dtype_enum}"


def write_captured_warmup(version_dir: Path, records: list[bytes]) -> int:
    path = warmup_path(version_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(frame(r) for r in records))
    return len(records)
