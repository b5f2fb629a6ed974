"""Captured traffic read back: the TFRecord files of `PredictionLog`s that serve-local's `logging_config` and
`trainserve proxy` write, for `replay`, `drift` and `proxy export`.

Files are read in name order (`<prefix>-<host>-<pid>-<UTC time>-<seq>.tfrecord`: one writer's files in the order
written), records filtered by model and, with `--shard I/N`, every N-th kept record from record I, so N readers
share one capture and each record is read by exactly one. A capture is often read while it is written or after
its writer was killed, so damage does not stop the read: a record whose data checksum fails is skipped (its
length is intact, so the next one is found); a truncated tail or a broken length ends that file. Each is one
warning line naming the file, the byte and what was skipped. A capture that yields nothing to read is one error
line: no files, no records, or records of other models only.

A read is of a snapshot taken as it starts: the files there then, each up to the size it had then, whole records
only. A capture still being written (a replay against the capturing server itself, whose calls a capture that did
not honour `x-trainserve-origin` would append to the files being read) can neither grow the read nor make it
endless; what was written after the start is counted when the read ends (`after_start`) and left out.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from google.protobuf.message import DecodeError

from trainserve.errors import TrainserveError
from trainserve.protos import predict_pb2, prediction_log_pb2
from trainserve.shards import Shard
from trainserve.tfrecord import DamagedRecord, iter_records
from trainserve.traffic.files import SUFFIX

log = logging.getLogger(__name__)
_FRAME_OVERHEAD = 16  # length (8), its CRC (4), the data's CRC (4)


@dataclass(frozen=True)
class CapturedRequest:
    """One captured Predict: what was asked, what was answered, by which version, when, under which id."""

    model: str
    version: int
    signature: str
    timestamp_s: int
    request_id: str
    sampling_rate: float
    request: predict_pb2.PredictRequest
    response: predict_pb2.PredictResponse


@dataclass
class ReadSummary:
    """What reading a capture found, for the report and the warning lines."""

    files: int = 0
    records: int = 0  # every intact record, of every model
    kept: int = 0  # of the model asked for (and, sharded, this shard's)
    other_models: Counter = field(default_factory=Counter)
    skipped: int = 0  # records skipped for a bad checksum, or not a Predict PredictionLog
    skipped_bytes: int = 0  # tails not read (truncated, broken length)
    damage: list[str] = field(default_factory=list)  # one line each
    after_start: AfterStart = field(default_factory=lambda: AfterStart())

    def as_dict(self) -> dict:
        return {
            "files": self.files,
            "records": self.records,
            "kept": self.kept,
            "other_models": dict(self.other_models),
            "skipped_records": self.skipped,
            "skipped_bytes": self.skipped_bytes,
            "damage": list(self.damage),
            "after_start": self.after_start.as_dict(),
        }


@dataclass
class AfterStart:
    """What the capture gained (or lost) while it was read, left out of the read: records appended to the files
    read (past their size at the start), files that appeared, files that went (rotated away) before they were read."""

    records: int = 0  # in the files grown and the new ones
    files_grown: int = 0
    files_new: int = 0
    files_gone: int = 0

    def as_dict(self) -> dict:
        return {
            "records": self.records,
            "files_grown": self.files_grown,
            "files_new": self.files_new,
            "files_gone": self.files_gone,
            "why": "written after the read began: a read is of the capture as it was at its start",
        }

    def said(self) -> str | None:
        """One line for the log, or None when the capture did not change while it was read."""
        if not (self.records or self.files_gone):
            return None
        gone = f"; {self.files_gone} file(s) rotated away before they were read" if self.files_gone else ""
        return (
            f"left out {self.records} record(s) written after the read began ({self.files_grown} file(s) grown, "
            f"{self.files_new} new){gone}: a read is of the capture as it was at its start"
        )


def capture_files(paths: list[Path]) -> list[Path]:
    """The capture's files in name order: each path a `.tfrecord` file (or any file named directly) or a
    directory whose `*.tfrecord` files (at any depth) are taken; one error line when there are none."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files += sorted(p for p in path.rglob(f"*{SUFFIX}") if p.is_file() and not p.name.startswith("."))
        elif path.is_file():
            files.append(path)
        else:
            raise TrainserveError(f"{path}: no such file or directory: expected a capture directory or file")
    if not files:
        said = ", ".join(map(str, paths))
        raise TrainserveError(f"{said}: holds no capture files (*{SUFFIX}): expected the directory a capture wrote")
    return sorted(dict.fromkeys(files), key=lambda p: (p.name, str(p)))


def snapshot(paths: list[Path]) -> dict[Path, int]:
    """The capture's files now and each one's size: what a read started now reads, and no more."""
    sizes = {}
    for path in capture_files(paths):
        with contextlib.suppress(FileNotFoundError):  # listed a moment ago, rotated away since
            sizes[path] = path.stat().st_size
    return sizes


def read_capture(
    paths: list[Path], model: str, shard: Shard | None = None, summary: ReadSummary | None = None
) -> Iterator[CapturedRequest]:
    """Every captured Predict of `model` in the files' name order (this shard's only), of the snapshot taken at
    the first record asked for; `summary` is filled as the read goes, and its `after_start` at the end. Raises a
    one-line TrainserveError at the end when nothing of `model` was found."""
    shard = shard or Shard()
    summary = summary if summary is not None else ReadSummary()
    sizes = snapshot(paths)
    summary.files = len(sizes)
    read_to: dict[Path, int] = {}
    index = 0
    for path, size in sizes.items():
        for captured in _records_of(path, size, summary, read_to):
            if captured is None:
                continue
            if captured.model != model:
                summary.other_models[captured.model] += 1
                continue
            index += 1
            if shard.takes(index - 1):
                summary.kept += 1
                yield captured
    summary.after_start = _after_start(paths, read_to)
    said = summary.after_start.said()
    if said:
        log.info("%s", said)
    if index == 0:
        raise TrainserveError(_nothing_found(paths, model, summary))


def _after_start(paths: list[Path], read_to: dict[Path, int]) -> AfterStart:
    """Count, by their frames' lengths alone, the records past what was read: in the files read and in new ones."""
    after = AfterStart(files_gone=sum(1 for offset in read_to.values() if offset < 0))
    try:
        now = capture_files(paths)
    except TrainserveError:  # every file went
        now = []
    for path in now:
        start = read_to.get(path)
        if start is not None and start < 0:
            continue
        counted = count_frames(path, start or 0)
        after.records += counted
        if start is None:
            after.files_new += 1
        elif counted:
            after.files_grown += 1
    return after


def count_frames(path: Path, start: int) -> int:
    """Records (whole, or being written) from byte `start` of `path`, read by their length headers only."""
    count = 0
    with contextlib.suppress(FileNotFoundError), open(path, "rb") as stream:
        size = stream.seek(0, os.SEEK_END)
        while start < size:
            stream.seek(start)
            header = stream.read(8)
            count += 1
            if len(header) < 8:
                break
            start += _FRAME_OVERHEAD + int.from_bytes(header, "little")
    return count


def _nothing_found(paths: list[Path], model: str, summary: ReadSummary) -> str:
    said = ", ".join(map(str, paths))
    if summary.other_models:
        others = ", ".join(f"{name!r} ({n})" for name, n in summary.other_models.most_common())
        return f"{said}: holds no records of model {model!r}, only of {others}: expected --model to name one of them"
    damaged = f" ({summary.damage[0]})" if summary.damage else ""
    return f"{said}: {summary.files} capture file(s) but no readable Predict records{damaged}"


class _Bounded:
    """A file read no further than `size` bytes: the size it had at the snapshot."""

    def __init__(self, stream: BinaryIO, size: int):
        self.stream, self.size = stream, size

    def read(self, n: int) -> bytes:
        return self.stream.read(max(0, min(n, self.size - self.stream.tell())))

    def seek(self, offset: int) -> None:
        self.stream.seek(offset)


def _records_of(path: Path, size: int, summary: ReadSummary, read_to: dict[Path, int]):
    """One file's records up to `size`, decoded; damage skipped and noted (one warning line each). `read_to[path]`:
    the byte after the last whole record read (-1: the file went before it was opened)."""
    try:
        stream = open(path, "rb")  # noqa: SIM115 (closed below; a file rotated away is counted, not an error)
    except FileNotFoundError:
        read_to[path] = -1
        return
    with stream:
        bounded = _Bounded(stream, size)
        start = 0
        read_to[path] = 0
        while start is not None:
            bounded.seek(start)
            start = yield from _run_of_records(path, bounded, start, size, summary, read_to)


def _run_of_records(
    path: Path, stream: _Bounded, start: int, size: int, summary: ReadSummary, read_to: dict[Path, int]
):
    """Records from `start` until the end (returns None) or damage: where to go on after a bad data checksum
    (the length is intact), None after a truncated or unreadable tail."""
    try:
        for raw in iter_records(stream):
            summary.records += 1
            read_to[path] = stream.stream.tell()
            yield _decode(raw, path, summary)
        return None
    except DamagedRecord as damage:
        at = start + damage.offset
        if "truncated" in damage.reason and _grew(path, size):
            return None  # a record being written at the snapshot: counted with what came after it
        if damage.reason.startswith("data checksum"):
            stream.seek(at)
            length = int.from_bytes(stream.read(8), "little")
            summary.skipped += 1
            _note(summary, f"{path}: record at byte {at} skipped: its data checksum does not match (corrupt)")
            read_to[path] = at + _FRAME_OVERHEAD + length
            return read_to[path]
        summary.skipped_bytes += size - at
        read_to[path] = size  # what follows the damage is no record written after the start
        what = "the last record is truncated (a writer killed mid-write?)" if "truncated" in damage.reason else ""
        _note(
            summary,
            f"{path}: {what or damage.reason} at byte {at}: records before it read, the last {size - at} bytes skipped",
        )
        return None


def _grew(path: Path, size: int) -> bool:
    try:
        return path.stat().st_size > size
    except FileNotFoundError:
        return False


def _decode(raw: bytes, path: Path, summary: ReadSummary) -> CapturedRequest | None:
    try:
        entry = prediction_log_pb2.PredictionLog.FromString(raw)
    except DecodeError:
        entry = None
    if entry is None or entry.WhichOneof("log_type") != "predict_log":
        summary.skipped += 1
        kind = "not a PredictionLog" if entry is None else f"a {entry.WhichOneof('log_type') or 'empty'} log"
        _note(summary, f"{path}: record {summary.records} skipped: {kind}, expected a predict_log")
        return None
    meta, request = entry.log_metadata, entry.predict_log.request
    spec = meta.model_spec
    return CapturedRequest(
        model=spec.name or request.model_spec.name,
        version=spec.version.value or entry.predict_log.response.model_spec.version.value,
        signature=spec.signature_name or request.model_spec.signature_name or "serving_default",
        timestamp_s=meta.timestamp_secs,
        request_id=meta.request_origin,
        sampling_rate=meta.sampling_config.sampling_rate,
        request=request,
        response=entry.predict_log.response,
    )


def _note(summary: ReadSummary, line: str) -> None:
    summary.damage.append(line)
    log.warning("%s", line)
