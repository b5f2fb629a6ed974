"""Files that other processes read while they are written: atomic replacement under a name no other writer can
pick (two containers are both pid 1), fsync'd directories, a lock beside a file for its read-modify-write, and a
writable destination proven before the work that fills it."""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

from trainserve.errors import TrainserveError


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def unique_sibling(path: Path, role: str) -> Path:
    """A hidden name beside `path` that no other process picks: random, not the pid (the same in two containers)."""
    return path.with_name(f".{path.name}.{role}-{secrets.token_hex(8)}")


def ensure_writable_dir(directory: Path, what: str) -> None:
    """Create `directory` and prove it takes files, so that a run fails before its work, not after it."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = unique_sibling(directory / "probe", "w")  # hidden: no server takes it for a version
        probe.touch(exist_ok=False)
        probe.unlink()
    except OSError as exc:
        raise TrainserveError(
            f"{what} {directory}: cannot write there ({exc.strerror}): expected a writable directory"
        ) from None


def write_file_atomic(path: Path, data: bytes) -> Path:
    """Write via a temp file of its own (created exclusively, mode as `open` gives), fsync and one rename: readers
    in other processes see all of it or none, and two writers of one path never share a temp file. A symlink is
    written through: its target is replaced and the link kept (a user's link to a shared file stays one)."""
    path = Path(path)
    target = Path(os.path.realpath(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = unique_sibling(target, "tmp")
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)
    return path


@contextlib.contextmanager
def locked(path: Path, role: str = "lock", holder: str | None = None) -> Iterator[None]:
    """Hold an exclusive flock on `<dir>/.<name>.<role>` for a read-modify-write of `path` by several processes.
    With `holder` (who else would hold it), a lock already held is refused at once, naming `holder`, not awaited."""
    lock_path = Path(path).with_name(f".{Path(path).name}.{role}")
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise TrainserveError(
            f"cannot create the lock {lock_path} ({exc.strerror}): expected a writable directory beside {path}"
        ) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (fcntl.LOCK_NB if holder else 0))
        except BlockingIOError:
            raise TrainserveError(f"{holder} holds {lock_path}: expected one at a time") from None
        yield
    finally:
        os.close(fd)  # releases the lock
