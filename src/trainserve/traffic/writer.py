"""Captured records to disk, off the request path: a bounded queue and one thread that writes.

A request only offers its record (`TrafficWriter.submit`, never blocking); the thread encodes, frames
(trainserve.tfrecord) and appends it. When the queue is full (a slow or hung volume) or a write fails (a full
disk, a read-only volume, a directory that cannot be made) the record is dropped and counted by reason; the
request never waits and never fails. Files are written straight to their final names with one write per record,
so a killed writer leaves every record but the one it was writing; `iter_records` stops at that one.

Names: `<filename_prefix>-<host>-<pid>-<UTC yyyymmddThhmmss>-<seq5>.tfrecord`, so replicas (the host is the pod)
and restarts writing into one volume never clash. A file is closed at `max_file_bytes`; the files of this host
are kept under `max_total_bytes` in all by deleting the oldest (a restarted server counts its predecessors' files).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import re
import socket
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainserve.errors import TrainserveError
from trainserve.options import option
from trainserve.tfrecord import frame

log = logging.getLogger(__name__)

SUFFIX = ".tfrecord"
MIB = 1 << 20
RETRY_SECONDS = 1.0  # after a failed write, records are dropped at once for this long before a file is tried again
# Why a record was not written (the `reason` label of the drop counters).
QUEUE_FULL, WRITE_ERROR, ENCODE_ERROR = "queue_full", "write_error", "encode_error"
DROP_REASONS = (QUEUE_FULL, WRITE_ERROR, ENCODE_ERROR)

Record = bytes | Callable[[], bytes]  # the bytes, or a function the writer thread calls to make them
_STOP = object()


@dataclass(frozen=True)
class WriterLimits:
    """How much a writer may hold: per file, on disk in all (this host's files), and records waiting in memory.
    A config's field `capture: WriterLimits` makes the flags `--capture-max-file-mb`, ... (trainserve.options)."""

    max_file_mb: float = option(64.0, "close a capture file at this size (MiB) and start the next")
    max_total_mb: float = option(1024.0, "keep this host's capture files under this size (MiB) in all: oldest go")
    queue_records: int = option(1000, "records waiting for the disk; past that, records are dropped and counted")

    @property
    def max_file_bytes(self) -> int:
        return int(self.max_file_mb * MIB)

    @property
    def max_total_bytes(self) -> int:
        return int(self.max_total_mb * MIB)

    def check(self) -> None:
        if min(self.max_file_bytes, self.max_total_bytes, self.queue_records) < 1:
            raise TrainserveError(f"capture limits {self}: expected sizes and a queue length above 0")
        if self.max_file_bytes > self.max_total_bytes:
            raise TrainserveError(
                f"capture file size {self.max_file_mb} MiB exceeds the total {self.max_total_mb} MiB: expected <= total"
            )


def host_name() -> str:
    """This host (a pod's name in Kubernetes) as a file-name part: anything but [A-Za-z0-9._-] becomes _."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "host"


def capture_file_name(prefix: str, host: str, pid: int, when: float, seq: int) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(when))
    return f"{prefix}-{host}-{pid}-{stamp}-{seq:05d}{SUFFIX}"


class TrafficWriter:
    """Writes records under `filename_prefix` (a path prefix, as TF Serving's LogCollectorConfig holds it) from a
    thread of its own. `written` and `dropped` (by reason) may be read at any time, e.g. by a metrics scrape."""

    def __init__(self, filename_prefix: str | Path, limits: WriterLimits = WriterLimits(), host: str | None = None):
        limits.check()
        prefix = Path(filename_prefix)
        self.directory, self.prefix, self.limits = prefix.parent, prefix.name, limits
        self.host, self.pid = host or host_name(), os.getpid()
        self.written, self.dropped = 0, Counter({reason: 0 for reason in DROP_REASONS})
        self._counts = threading.Lock()
        self._queue: queue.Queue = queue.Queue(maxsize=limits.queue_records)
        self._fd: int | None = None
        self._size = self._seq = 0
        self._files: deque[list] = deque()  # [path, size] of this host's files, oldest first
        self._retry_at = 0.0
        self._failing: str | None = None  # the error being logged once, until writes succeed again
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"capture-{self.prefix}", daemon=True)
        self._thread.start()

    def submit(self, record: Record) -> bool:
        """Offer one record; False (and counted) when it is dropped because the queue is full. Never blocks."""
        if self._closed:
            return False
        try:
            self._queue.put_nowait(record)
            return True
        except queue.Full:
            self._count(QUEUE_FULL)
            return False

    def close(self, timeout: float | None = 10) -> None:
        """Write what is queued, close the file and end the thread (within `timeout`: a hung volume does not hold
        the caller; its records are lost with the process)."""
        if self._closed:
            return
        self._closed = True
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            self._queue.put(_STOP, timeout=timeout)
        except queue.Full:
            log.warning("capture %s: queue still full at close; %d record(s) lost", self.prefix, self._queue.qsize())
            return
        self._thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def _count(self, reason: str | None) -> None:
        with self._counts:
            if reason is None:
                self.written += 1
            else:
                self.dropped[reason] += 1

    def _run(self) -> None:
        self._scan_existing()
        while (item := self._queue.get()) is not _STOP:
            self._write_one(item)
        self._close_file()

    def _write_one(self, item: Record) -> None:
        try:
            data = item() if callable(item) else item
        except Exception as exc:  # a record that cannot be encoded is lost, not the writer
            log.warning("capture %s: a record could not be encoded (%s); dropped", self.prefix, exc)
            self._count(ENCODE_ERROR)
            return
        record = frame(data)
        if time.monotonic() < self._retry_at:
            self._count(WRITE_ERROR)
            return
        try:
            self._append(record)
        except OSError as exc:
            self._failed(exc)
            self._count(WRITE_ERROR)
            return
        if self._failing:
            log.info("capture %s: writing again", self.prefix)
            self._failing = None
        self._count(None)

    def _append(self, record: bytes) -> None:
        if self._fd is None or self._size + len(record) > self.limits.max_file_bytes:
            self._open_next()
        self._make_room(len(record))
        view = memoryview(record)
        while view:
            view = view[os.write(self._fd, view) :]
        self._size += len(record)
        self._files[-1][1] = self._size

    def _open_next(self) -> None:
        self._close_file()
        self.directory.mkdir(parents=True, exist_ok=True)
        self._seq += 1
        path = self.directory / capture_file_name(self.prefix, self.host, self.pid, time.time(), self._seq)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        self._size = 0
        self._files.append([path, 0])

    def _make_room(self, incoming: int) -> None:
        """Delete this host's oldest files (never the one being written) until the new record fits the total."""
        while len(self._files) > 1 and sum(size for _, size in self._files) + incoming > self.limits.max_total_bytes:
            path, _ = self._files.popleft()
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def _failed(self, exc: OSError) -> None:
        """Drop the file being written (cut back to its last whole record where the volume lets us), and wait
        RETRY_SECONDS before trying a new one."""
        if self._fd is not None:
            with contextlib.suppress(OSError):  # else the reader stops at the partial record and counts it
                os.ftruncate(self._fd, self._size)
        self._close_file()
        self._retry_at = time.monotonic() + RETRY_SECONDS
        reason = f"{exc.strerror or exc}: {exc.filename or self.directory}"
        if reason != self._failing:
            log.warning("capture %s: cannot write (%s); records are dropped and counted", self.prefix, reason)
            self._failing = reason

    def _close_file(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _scan_existing(self) -> None:
        """This host's files from earlier runs count towards the total, oldest first."""
        mine = f"{self.prefix}-{self.host}-"
        try:
            found = [p for p in self.directory.iterdir() if p.name.startswith(mine) and p.name.endswith(SUFFIX)]
            found.sort(key=lambda p: (p.stat().st_mtime, p.name))
            self._files.extend([p, p.stat().st_size] for p in found)
        except OSError:
            pass  # no directory yet (made at the first record) or none that can be read: nothing to count
