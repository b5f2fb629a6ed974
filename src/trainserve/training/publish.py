"""Publish a staged SavedModel as the next numbered version, atomically.

TF Serving loads the newest numeric directory as soon as it appears and never checks that it is
complete (tensorflow/serving#1086). So a version is staged in a non-numeric directory (`.tmp-...`,
skipped by the server) on the same filesystem, fsynced, and made visible by one rename. rename(2)
onto an existing non-empty directory fails, so two trainers racing for the same number both succeed,
with different numbers.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import socket
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from trainserve.errors import TrainserveError
from trainserve.files import fsync_dir
from trainserve.layout import STAGING_PREFIX, numeric_versions, write_metadata

log = logging.getLogger(__name__)


class PublishedVersion(NamedTuple):
    """A version's number and directory; a tuple, so `version, path = publish_version(...)` unpacks."""

    version: int
    path: Path


def ensure_writable(model_base: Path) -> None:
    """Create `model_base` and prove it takes files: checked before training, not after it."""
    try:
        model_base.mkdir(parents=True, exist_ok=True)
        probe = _staging_name(model_base)
        probe.mkdir()
        probe.rmdir()
    except OSError as exc:
        raise TrainserveError(
            f"cannot write to export directory {model_base} ({exc.strerror}): expected a writable directory"
        ) from None


def staging_dir(model_base: Path) -> Path:
    """A fresh non-numeric directory inside `model_base`, named after this host and process."""
    ensure_writable(model_base)
    remove_stale_staging(model_base)
    path = _staging_name(model_base)
    path.mkdir()
    return path


def _staging_name(model_base: Path) -> Path:
    return model_base / f"{STAGING_PREFIX}{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def remove_stale_staging(model_base: Path) -> None:
    """Remove staging dirs left by killed trainers of this host (their process no longer exists)."""
    host = socket.gethostname()
    for path in model_base.glob(f"{STAGING_PREFIX}{host}-*"):
        pid = path.name[len(STAGING_PREFIX) + len(host) + 1 :].split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            log.info("removing %s, left by a trainer that was killed while publishing", path.name)
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fsync_tree(root: Path) -> None:
    """fsync every file and directory below `root`, so a crash after the rename loses nothing."""
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def publish_version(staged: Path, metadata: dict, keep: int | None = None) -> PublishedVersion:
    """Rename `staged` to the next free version number under its parent.

    `metadata` is written to `assets.extra/trainserve.json` with the number it is published as.
    """
    model_base = staged.parent
    version = max(numeric_versions(model_base), default=0) + 1
    while True:
        write_metadata(staged, {**metadata, "version": version})
        fsync_tree(staged)
        target = model_base / str(version)
        try:
            os.rename(staged, target)
            break
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            version = max(max(numeric_versions(model_base), default=0), version) + 1
    fsync_dir(model_base)
    log.info("published version %d at %s", version, target)
    if keep:
        prune_versions(model_base, keep, protect=version)
    return PublishedVersion(version, target)


def prune_versions(model_base: Path, keep: int, protect: int) -> list[int]:
    """Delete all but the newest `keep` versions; `protect` (the new one) is never deleted.

    Each old version is first renamed to a non-numeric name, so the server stops seeing it at once and
    never reads a half-deleted directory.
    """
    versions = numeric_versions(model_base)
    doomed = [v for v in versions[: max(0, len(versions) - keep)] if v != protect]
    for version in doomed:
        trash = _staging_name(model_base)
        os.rename(model_base / str(version), trash)
        shutil.rmtree(trash, ignore_errors=True)
        log.info("pruned version %d (--keep %d)", version, keep)
    return doomed


def publish_or_discard(
    staged: Path, prepare: Callable[[Path], None], metadata: dict, keep: int | None
) -> PublishedVersion:
    """Fill and check the staged directory with `prepare`; publish it if that passes, else delete it."""
    try:
        prepare(staged)
        return publish_version(staged, metadata, keep)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
