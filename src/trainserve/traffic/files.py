"""A capture writer's files: their names, who owns them, and which of them rotation may delete.

Names: `<prefix>-<host>-<pid>-<token>-<UTC yyyymmddThhmmss>-<seq5>.tfrecord`. The host is the pod in Kubernetes, so
replicas writing into one volume never clash; the token (8 random hex digits drawn when a writer starts) tells apart
two writers of one host, which the host and even the pid cannot (two containers of one node are both pid 1).

Ownership: while a writer runs it holds an exclusive `flock` on `.<prefix>-<host>-<token>.lock` beside its files.
At start it adopts the files of its own host whose token's lock nobody holds (a predecessor: a restarted server,
whose lock went with its process) and counts them towards `max_total_mb`, as the oldest; files whose lock is held
belong to a live writer sharing the prefix and are neither counted nor deleted. Files named before tokens existed
(`<prefix>-<host>-<pid>-<stamp>-<seq>`) are adopted as predecessors. flock is kept by the kernel of one host, which
is what the check needs: writers of other hosts own other names. (On a network filesystem whose flock is not shared
between clients, hosts still differ by name.)
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

SUFFIX = ".tfrecord"
_OWNED = re.compile(r"(?P<pid>\d+)-(?:(?P<token>[0-9a-f]{8})-)?\d{8}T\d{6}-\d{5,}" + re.escape(SUFFIX))


def new_token() -> str:
    return secrets.token_hex(4)


def capture_file_name(prefix: str, host: str, pid: int, token: str, when: float, seq: int) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(when))
    return f"{prefix}-{host}-{pid}-{token}-{stamp}-{seq:05d}{SUFFIX}"


@dataclass
class CaptureFile:
    """One file a writer counts: its size, and its records when this writer wrote them (None: a predecessor's)."""

    path: Path
    size: int
    records: int | None = 0


class OwnedFiles:
    """The files one writer counts towards its bound, oldest first; the last is the one being written (if any)."""

    def __init__(self, directory: Path, prefix: str, host: str, token: str):
        self.directory, self.prefix, self.host, self.token = directory, prefix, host, token
        self.files: deque[CaptureFile] = deque()
        self.total = 0  # bytes in `files`, kept as they change (a sum per record would grow with the file count)
        self._lock_fd: int | None = None

    def lock_path(self, token: str) -> Path:
        """The lock a writer of this host holds on its files while it runs."""
        return self.directory / f".{self.prefix}-{self.host}-{token}.lock"

    def claim(self) -> None:
        """Make the directory and hold this writer's lock (again, after the directory was deleted)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        if self._lock_fd is not None:
            if os.fstat(self._lock_fd).st_nlink > 0:
                return
            os.close(self._lock_fd)
        self._lock_fd = os.open(self.lock_path(self.token), os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)  # waits only while another writer's start-up check holds it

    def release(self) -> None:
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                self.lock_path(self.token).unlink()
            os.close(self._lock_fd)
            self._lock_fd = None

    def adopt_predecessors(self) -> list[Path]:
        """This host's files of writers no longer running count towards the bound (oldest first); the ones adopted."""
        mine = f"{self.prefix}-{self.host}-"
        try:
            names = [p for p in self.directory.iterdir() if p.name.startswith(mine) and p.name.endswith(SUFFIX)]
        except OSError:
            return []  # no directory yet (made at the first record) or none that can be read: nothing to count
        owners: dict[str | None, bool] = {}
        adopted = []
        for path in names:
            match = _OWNED.fullmatch(path.name[len(mine) :])
            if match is None or match["token"] == self.token:
                continue  # another host whose name starts like ours, or not a capture file
            token = match["token"]
            if token not in owners:
                owners[token] = token is None or not self._held(token)
            if owners[token]:
                adopted.append(path)
        found = []
        for path in adopted:
            with contextlib.suppress(OSError):  # gone meanwhile: nothing to count
                stat = path.stat()
                found.append((stat.st_mtime, path.name, CaptureFile(path, stat.st_size, None)))
        self.files.extend(f for *_, f in sorted(found, key=lambda t: t[:2]))
        self.total = sum(f.size for f in self.files)
        for token in (t for t, dead in owners.items() if dead and t is not None):
            with contextlib.suppress(OSError):
                self.lock_path(token).unlink()
        return [f.path for f in self.files]

    def _held(self, token: str) -> bool:
        """Whether a live writer holds `token`'s lock."""
        try:
            fd = os.open(self.lock_path(token), os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def add(self, path: Path) -> CaptureFile:
        """A new file this writer writes, now the newest."""
        self.files.append(CaptureFile(path, 0, 0))
        return self.files[-1]

    def grew(self, record_bytes: int) -> None:
        """One record appended to the newest file."""
        self.files[-1].size += record_bytes
        self.total += record_bytes

    def drop_newest(self) -> CaptureFile:
        """Forget the newest file (deleted, or removed as empty)."""
        gone = self.files.pop()
        self.total -= gone.size
        return gone

    def make_room(self, incoming: int, max_total: int) -> int:
        """Delete the oldest files, never the one being written, until `incoming` more bytes fit `max_total`; the
        records this writer had written into the deleted files."""
        deleted = 0
        while len(self.files) > 1 and self.total + incoming > max_total:
            gone = self.files.popleft()
            self.total -= gone.size
            with contextlib.suppress(FileNotFoundError):
                gone.path.unlink()
            deleted += gone.records or 0
        return deleted

    def forget_missing(self) -> int:
        """Drop the files someone deleted from the count; the records this writer had written into them."""
        kept, gone = deque(), 0
        for f in self.files:
            if f.path.exists():
                kept.append(f)
            else:
                gone += f.records or 0
        self.files = kept
        self.total = sum(f.size for f in kept)
        return gone
