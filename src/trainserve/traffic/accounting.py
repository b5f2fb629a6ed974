"""Where every record a capture was offered went: written, dropped (never written) or lost (accepted, then not kept).

Each record offered to a writer ends in exactly one outcome, counted once, so that at any moment

    offered = written + sum(dropped) + sum(lost) + pending

and `pending` (queued, or being written) is 0 once the writer is closed. Written records that leave the disk later
by design (rotation) or by someone's hand (a deleted file) are counted apart, under `deleted`: what is on disk is
`written - sum(deleted)` for this writer's own files. Calls a capture chose not to offer at all (trainserve's own
calls, traffic.origin) are counted under `skipped`, outside that sum.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

# Dropped: the record was never written.
QUEUE_FULL = "queue_full"  # the disk is slower than the traffic (a slow or hung volume)
WRITE_ERROR = "write_error"  # the write failed: a full disk, a read-only volume, a directory that cannot be made
ENCODE_ERROR = "encode_error"  # the record could not be serialized
TOO_LARGE = "too_large"  # one record larger than a capture file may be (max_file_mb)
CLOSED = "closed"  # offered after the writer was closed (a call answered during shutdown)
DROP_REASONS = (QUEUE_FULL, WRITE_ERROR, ENCODE_ERROR, TOO_LARGE, CLOSED)
# Lost: accepted, then not kept.
DIRECTORY_GONE = "directory_gone"  # written into a file that had been deleted (its directory removed) meanwhile
SHUTDOWN = "shutdown"  # still queued when close's time ran out
LOSS_REASONS = (DIRECTORY_GONE, SHUTDOWN)
# Deleted: written, then removed from the disk.
ROTATION = "rotation"  # the oldest files, to keep max_total_mb
REMOVED = "removed"  # a file deleted by someone else (found gone)
DELETE_REASONS = (ROTATION, REMOVED)
# Skipped: never offered.
ORIGIN = "origin"  # a call trainserve made itself (replay, eval, load: the x-trainserve-origin header)
SKIP_REASONS = (ORIGIN,)


@dataclass(frozen=True)
class Accounting:
    """One consistent reading of a writer's counters (`TrafficWriter.accounting()`)."""

    offered: int = 0
    written: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    lost: dict[str, int] = field(default_factory=dict)
    deleted: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def pending(self) -> int:
        """Records accepted and not yet settled: queued, or being written."""
        return self.offered - self.written - sum(self.dropped.values()) - sum(self.lost.values())

    def summary(self) -> str:
        """One log line's worth: every non-zero count."""

        def some(counts: dict[str, int]) -> str:
            return ", ".join(f"{reason} {n}" for reason, n in counts.items() if n) or "none"

        return (
            f"offered {self.offered}, written {self.written}, dropped {some(self.dropped)}, lost {some(self.lost)}, "
            f"pending {self.pending}"
        )


class Ledger:
    """The counters behind `Accounting`, safe to update from request threads and the writer's thread. Once
    `settle_rest` has counted what was still pending as lost, later outcomes of those records are ignored, so no
    record is counted twice."""

    def __init__(self):
        self.lock = threading.Lock()
        self._offered = self._written = 0
        self._dropped = Counter({r: 0 for r in DROP_REASONS})
        self._lost = Counter({r: 0 for r in LOSS_REASONS})
        self._deleted = Counter({r: 0 for r in DELETE_REASONS})
        self._skipped = Counter({r: 0 for r in SKIP_REASONS})
        self._settled = False

    def offer(self, dropped: str | None = None) -> None:
        """One record offered (call with `lock` held); `dropped`: the reason it was refused on the spot."""
        self._offered += 1
        if dropped is not None:
            self._dropped[dropped] += 1

    def outcome(self, written: bool = False, dropped: str | None = None, lost: str | None = None) -> None:
        """The writer's thread settles one accepted record."""
        with self.lock:
            if self._settled:
                return
            if written:
                self._written += 1
            elif dropped is not None:
                self._dropped[dropped] += 1
            elif lost is not None:
                self._lost[lost] += 1

    def deleted(self, reason: str, records: int) -> None:
        with self.lock:
            self._deleted[reason] += records

    def skipped(self, reason: str) -> None:
        with self.lock:
            self._skipped[reason] += 1

    @property
    def settled(self) -> bool:
        """Whether `settle_rest` ran: the writer's thread stops then."""
        return self._settled

    def dropped_so_far(self, reason: str) -> int:
        """One counter, read without the lock (for log lines)."""
        return self._dropped[reason]

    def settle_rest(self, reason: str) -> int:
        """Count every pending record as lost for `reason`, and ignore their outcomes from now on; how many."""
        with self.lock:
            rest = self._snapshot().pending
            self._lost[reason] += rest
            self._settled = True
            return rest

    def snapshot(self) -> Accounting:
        with self.lock:
            return self._snapshot()

    def _snapshot(self) -> Accounting:
        return Accounting(
            self._offered,
            self._written,
            dict(self._dropped),
            dict(self._lost),
            dict(self._deleted),
            dict(self._skipped),
        )
