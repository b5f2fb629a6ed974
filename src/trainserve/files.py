"""Files that other processes read while they are written: atomic replacement, fsync'd directories, and a
writable destination proven before the work that fills it."""

from __future__ import annotations

import os
from pathlib import Path

from trainserve.errors import TrainserveError


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_writable_dir(directory: Path, what: str) -> None:
    """Create `directory` and prove it takes files, so that a run fails before its work, not after it."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".probe-{os.getpid()}"  # hidden: no server takes it for a version
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise TrainserveError(
            f"{what} {directory}: cannot write there ({exc.strerror}): expected a writable directory"
        ) from None


def write_file_atomic(path: Path, data: bytes) -> Path:
    """Write via a temp file, fsync and one rename: readers in other processes see all of it or none."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path
