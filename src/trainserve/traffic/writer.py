"""Captured records to disk, off the request path: a bounded queue and one thread that writes.

A request only offers its record (`TrafficWriter.submit`, never blocking on the disk); the thread encodes, frames
(trainserve.tfrecord) and appends it. Every record offered ends in one outcome, counted once (traffic.accounting):
written; dropped, when the queue is full (a slow or hung volume), a write fails (a full disk, a read-only volume, a
directory that cannot be made), it cannot be encoded, or it is larger than a capture file may be; or lost, when its
file was deleted under the writer or `close` ran out of time with it still queued. The request never waits and
never fails. Each fault is logged once when it starts and once when it clears, with the counts.

Files are written straight to their final names with one write per record, so a killed writer leaves every record
but the one it was writing; `iter_records` stops at that one. After each write the writer checks (one fstat) that
its file is still linked: a file deleted meanwhile (its directory removed) is replaced by a new one, in a directory
made again. A file is closed at `max_file_bytes`; the files this writer owns (traffic.files: its own and its dead
predecessors' on this host, never another live writer's) are kept under `max_total_bytes` by deleting the oldest,
never the file being written; a record too large for a file is dropped, so it cannot push the others out.
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
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainserve.errors import TrainserveError
from trainserve.options import option
from trainserve.tfrecord import frame
from trainserve.traffic.accounting import (
    CLOSED,
    DIRECTORY_GONE,
    ENCODE_ERROR,
    ORIGIN,
    QUEUE_FULL,
    REMOVED,
    ROTATION,
    SHUTDOWN,
    TOO_LARGE,
    WRITE_ERROR,
    Accounting,
    Ledger,
)
from trainserve.traffic.files import CaptureFile, OwnedFiles, capture_file_name, new_token

log = logging.getLogger(__name__)

MIB = 1 << 20
RETRY_SECONDS = 1.0  # after a failed write, records are dropped at once for this long before a file is tried again
# How often the file's path is checked against the open file (a stat of the path): catches a file moved away, or
# deleted on a filesystem that keeps deleted open files linked (NFS renames them to .nfsXXXX). Its link count,
# which catches a plain deletion, is checked after every write (an fstat).
PATH_CHECK_SECONDS = 1.0

Record = bytes | Callable[[], bytes]  # the bytes, or a function the writer thread calls to make them
_STOP = object()


@dataclass(frozen=True)
class WriterLimits:
    """How much a writer may hold: per file, on disk in all (this host's files), and records waiting in memory.
    A config's field `capture: WriterLimits` makes the flags `--capture-max-file-mb`, ... (trainserve.options)."""

    max_file_mb: float = option(64.0, "close a capture file at this size (MiB) and start the next")
    max_total_mb: float = option(1024.0, "keep this host's capture files under this size (MiB) in all: oldest go")
    queue_records: int = option(1000, "records waiting for the disk; past that, records are dropped and counted")
    drain_seconds: float = option(
        10.0, "at shutdown, wait this long for queued capture records to be written; the rest are counted lost"
    )

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
        if not self.drain_seconds >= 0:
            raise TrainserveError(f"capture drain_seconds {self.drain_seconds}: expected 0 or more seconds")


def host_name() -> str:
    """This host (a pod's name in Kubernetes) as a file-name part: anything but [A-Za-z0-9._-] becomes _."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "host"


def write_all(fd: int, data: bytes) -> None:
    """Append `data` to the file (the one place the writer touches the disk's contents; a test slows it here)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class TrafficWriter:
    """Writes records under `filename_prefix` (a path prefix, as TF Serving's LogCollectorConfig holds it) from a
    thread of its own. `accounting()` may be read at any time, e.g. by a metrics scrape."""

    def __init__(self, filename_prefix: str | Path, limits: WriterLimits = WriterLimits(), host: str | None = None):
        limits.check()
        prefix = Path(filename_prefix)
        self.directory, self.prefix, self.limits = prefix.parent, prefix.name, limits
        self.host, self.pid, self.token = host or host_name(), os.getpid(), new_token()
        self._ledger = Ledger()
        self._files = OwnedFiles(self.directory, self.prefix, self.host, self.token)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()  # bounded by submit, so close can always queue _STOP
        self._fd: int | None = None
        self._seq = 0
        self._retry_at = self._path_check_at = 0.0
        self._faults: dict[str, tuple[float, int]] = {}  # fault -> (since, count of its reason then), logged once
        self._told: set[str] = set()  # one-off losses already logged
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=f"capture-{self.prefix}", daemon=True)
        self._thread.start()

    def submit(self, record: Record) -> bool:
        """Offer one record; False (and counted) when it is dropped at once: the queue is full, or the writer
        closed. Never waits for the disk."""
        with self._ledger.lock:
            if self._closing:
                self._ledger.offer(dropped=CLOSED)
                return False
            if self._queue.qsize() >= self.limits.queue_records:
                self._ledger.offer(dropped=QUEUE_FULL)
                full = QUEUE_FULL not in self._faults
                if full:
                    self._faults[QUEUE_FULL] = (time.monotonic(), self._ledger.dropped_so_far(QUEUE_FULL) - 1)
            else:
                self._ledger.offer()
                self._queue.put(record)
                return True
        if full:
            log.warning(
                "capture %s: %d records wait for the disk (a slow volume?); records are dropped and counted "
                "(queue_full) until the queue drains",
                self.prefix,
                self.limits.queue_records,
            )
        return False

    def skip(self, reason: str = ORIGIN) -> None:
        """Count a call the capture chose not to offer (traffic.origin: trainserve's own calls)."""
        self._ledger.skipped(reason)

    def accounting(self) -> Accounting:
        """Every record's outcome so far, read consistently (traffic.accounting)."""
        return self._ledger.snapshot()

    @property
    def written(self) -> int:
        return self.accounting().written

    @property
    def dropped(self) -> Counter:
        return Counter(self.accounting().dropped)

    def close(self, timeout: float | None = None) -> Accounting:
        """Refuse new records, write the queued ones and close the file, within `timeout` seconds (default the
        limits' drain_seconds): what is still queued then is counted lost (shutdown). Logs one line with the
        counts; returns them."""
        timeout = self.limits.drain_seconds if timeout is None else timeout
        with self._ledger.lock:
            if self._closing:
                return self._ledger._snapshot()
            self._closing = True
        self._queue.put(_STOP)
        self._thread.join(timeout)
        if self._thread.is_alive():
            rest = self._ledger.settle_rest(SHUTDOWN)
            counts = self.accounting()
            log.warning(
                "capture %s: %d record(s) still queued after %.1f s of shutdown: counted lost (shutdown); %s",
                self.prefix,
                rest,
                timeout,
                counts.summary(),
            )
            return counts
        counts = self.accounting()
        log.info("capture %s: closed; %s", self.prefix, counts.summary())
        return counts

    def _run(self) -> None:
        adopted = self._files.adopt_predecessors()
        if adopted:
            log.info(
                "capture %s: %d file(s) of earlier runs on this host (%.1f MiB) count towards the bound",
                self.prefix,
                len(adopted),
                self._files.total / MIB,
            )
        while (item := self._queue.get()) is not _STOP and not self._ledger.settled:
            self._write_one(item)
            if self._queue.empty():
                self._fault_cleared(QUEUE_FULL, "the queue drained")
        self._close_file()
        self._files.release()

    def _write_one(self, item: Record) -> None:
        try:
            record = frame(item() if callable(item) else item)
        except Exception as exc:  # a record that cannot be encoded is lost, not the writer
            self._once(ENCODE_ERROR, "a record could not be encoded (%s); such records are dropped (encode_error)", exc)
            self._ledger.outcome(dropped=ENCODE_ERROR)
            return
        if len(record) > self.limits.max_file_bytes:
            self._once(
                TOO_LARGE,
                "a record of %d bytes exceeds max_file_mb (%s); such records are dropped (too_large)",
                len(record),
                self.limits.max_file_mb,
            )
            self._ledger.outcome(dropped=TOO_LARGE)
            return
        if time.monotonic() < self._retry_at:
            self._ledger.outcome(dropped=WRITE_ERROR)
            return
        try:
            kept = self._append(record)
        except OSError as exc:
            self._failed(exc)
            self._ledger.outcome(dropped=WRITE_ERROR)
            return
        self._fault_cleared(WRITE_ERROR, "writing again")
        self._ledger.outcome(written=kept, lost=None if kept else DIRECTORY_GONE)

    def _append(self, record: bytes) -> bool:
        """Write one framed record; False when its file turned out deleted as it was written (the record is gone)."""
        if self._fd is not None and self._unlinked():
            self._file_gone()
        if self._fd is None or self._current.size + len(record) > self.limits.max_file_bytes:
            self._open_next()
        self._ledger.deleted(ROTATION, self._files.make_room(len(record), self.limits.max_total_bytes))
        write_all(self._fd, record)
        self._files.grew(len(record))
        if self._unlinked():
            self._file_gone()
            return False
        self._current.records += 1
        return True

    @property
    def _current(self) -> CaptureFile:
        return self._files.files[-1]

    def _unlinked(self) -> bool:
        """Whether the file being written is no longer where the writer put it."""
        opened = os.fstat(self._fd)
        if opened.st_nlink == 0:
            return True
        if time.monotonic() < self._path_check_at:
            return False
        self._path_check_at = time.monotonic() + PATH_CHECK_SECONDS
        try:
            named = os.stat(self._current.path)
        except FileNotFoundError:
            return True
        return (named.st_dev, named.st_ino) != (opened.st_dev, opened.st_ino)

    def _file_gone(self) -> None:
        """The file being written was deleted (its directory removed): count its records as deleted, forget it
        and every other file gone with it, and write on into a new file."""
        gone = self._files.drop_newest()
        self._close_file()
        others = self._files.forget_missing()
        self._ledger.deleted(REMOVED, (gone.records or 0) + others)
        log.warning(
            "capture %s: %s was deleted or moved while being written (%d record(s) of this writer gone with it "
            "and its neighbours); writing on into a new file",
            self.prefix,
            gone.path,
            (gone.records or 0) + others,
        )

    def _open_next(self) -> None:
        self._close_file()
        self._files.claim()
        self._seq += 1
        name = capture_file_name(self.prefix, self.host, self.pid, self.token, time.time(), self._seq)
        self._fd = os.open(self.directory / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        self._files.add(self.directory / name)

    def _failed(self, exc: OSError) -> None:
        """Cut the file being written back to its last whole record (an empty one is removed), close it, and wait
        RETRY_SECONDS before trying a new one; the fault is logged when it starts."""
        if self._fd is not None:
            current = self._current
            with contextlib.suppress(OSError):  # else the reader stops at the partial record and counts it
                os.ftruncate(self._fd, current.size)
            if current.size == 0:  # a full disk would otherwise leave an empty file per retry
                self._files.drop_newest()
                with contextlib.suppress(OSError):
                    current.path.unlink()
            self._close_file()
        self._retry_at = time.monotonic() + RETRY_SECONDS
        if WRITE_ERROR not in self._faults:
            self._faults[WRITE_ERROR] = (time.monotonic(), self._ledger.dropped_so_far(WRITE_ERROR))
            log.warning(
                "capture %s: cannot write into %s (%s); records are dropped and counted (write_error) until a "
                "write succeeds",
                self.prefix,
                self.directory,
                exc.strerror or exc,
            )

    def _fault_cleared(self, fault: str, what: str) -> None:
        """Log once that `fault` (a drop reason) cleared, with the records it dropped meanwhile."""
        if fault in self._faults:
            since, before = self._faults.pop(fault)
            log.info(
                "capture %s: %s; %d record(s) dropped (%s) over %.1f s",
                self.prefix,
                what,
                self._ledger.dropped_so_far(fault) - before,
                fault,
                time.monotonic() - since,
            )

    def _once(self, kind: str, message: str, *args) -> None:
        if kind not in self._told:
            self._told.add(kind)
            log.warning("capture %s: " + message, self.prefix, *args)

    def _close_file(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
