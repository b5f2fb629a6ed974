"""Captured traffic as an eval set: the requests' inputs in one `.npz`, one row per example, with each row's
request id (and its row within that request) so that labels gathered later join on it.

Arrays: `x_test` (one input) or `x_test/<input>` (several), as `trainserve eval --data` and training read them;
`request_id` (str [N]), `request_row` (int64 [N]), `version` (the version that answered, int64 [N]) and
`timestamp_s` (int64 [N]). Strings are stored as text (UTF-8), not pickled objects.
"""

from __future__ import annotations

import io
from collections import defaultdict
from pathlib import Path

import numpy as np

from trainserve.errors import TrainserveError
from trainserve.files import write_file_atomic
from trainserve.shards import Shard
from trainserve.tensors import from_tensor_proto
from trainserve.traffic.reader import ReadSummary, read_capture


def export_capture(
    captures: list[Path], model: str, to: Path, shard: Shard | None = None
) -> tuple[Path, int, ReadSummary]:
    """Write `to` (atomically); returns it, the examples written and what reading the capture found."""
    if to.suffix != ".npz":
        raise TrainserveError(f"--to {to}: expected a FILE.npz")
    summary = ReadSummary()
    columns: dict[str, list[np.ndarray]] = defaultdict(list)
    ids, rows, versions, times = [], [], [], []
    names: tuple[str, ...] | None = None
    for record in read_capture(captures, model, shard, summary):
        inputs = {k: _batch(from_tensor_proto(v)) for k, v in record.request.inputs.items()}
        if names is None:
            names = tuple(sorted(inputs))
        if tuple(sorted(inputs)) != names:
            raise TrainserveError(
                f"request {record.request_id!r} sends inputs {', '.join(sorted(inputs))}, earlier ones "
                f"{', '.join(names)}: expected one signature's requests (export one model's traffic)"
            )
        count = len(next(iter(inputs.values())))
        for key, array in inputs.items():
            columns[key].append(array)
        ids += [record.request_id] * count
        rows.append(np.arange(count))
        versions += [record.version] * count
        times += [record.timestamp_s] * count
    arrays = {("x_test" if len(columns) == 1 else f"x_test/{k}"): _concatenate(k, v) for k, v in columns.items()}
    arrays.update(
        request_id=np.array(ids, dtype=str),
        request_row=np.concatenate(rows).astype(np.int64),
        version=np.array(versions, np.int64),
        timestamp_s=np.array(times, np.int64),
    )
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return write_file_atomic(to, buffer.getvalue()), len(ids), summary


def _batch(array: np.ndarray) -> np.ndarray:
    array = array.reshape(1) if array.ndim == 0 else array
    if array.dtype.kind == "O":  # DT_STRING: text when it is UTF-8, else bytes
        try:
            return np.array([v.decode("utf-8") for v in array.ravel()], dtype=str).reshape(array.shape)
        except UnicodeDecodeError:
            return np.array(list(array.ravel()), dtype=bytes).reshape(array.shape)
    return array


def _concatenate(name: str, arrays: list[np.ndarray]) -> np.ndarray:
    shapes = {a.shape[1:] for a in arrays}
    if len(shapes) > 1:
        said = ", ".join(str(list(s)) for s in sorted(shapes)[:4])
        raise TrainserveError(
            f"input {name!r} has examples of several shapes ({said}): expected one shape per input in an .npz"
        )
    return np.concatenate(arrays)
