"""Publish a staged SavedModel as the next numbered version, atomically.

TF Serving loads the newest numeric directory as soon as it appears and never checks that it is
complete (tensorflow/serving#1086). So a version is staged in a non-numeric directory (`.tmp-...`,
skipped by the server) on the same filesystem, fsynced, and made visible by one rename. rename(2)
onto an existing non-empty directory fails, so two trainers racing for the same number both succeed,
with different numbers.

Retention (`--keep N`) deletes old versions, but never one that the serving config names (a rollout label
such as `stable` or `previous`, or its `specific` version policy): TF Serving would unload it, requests for
the label would fail, and the next reload of the config would be refused (tensorflow/serving#1608).
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
from trainserve.model_server_config import parse_model_config

log = logging.getLogger(__name__)


class PublishedVersion(NamedTuple):
    """A version's number and directory; a tuple, so `version, path = publish_version(...)` unpacks."""

    version: int
    path: Path


class Retention(NamedTuple):
    """`--keep N`: the newest `keep` versions stay, and so does every version `serving_config` names."""

    keep: int
    serving_config: Path | None = None

    def versions_in_use(self, model_name: str) -> dict[int, list[str]]:
        """The versions of `model_name` that the serving config names, each with why (none without a config)."""
        if self.serving_config is None:
            log.warning("--keep %d without --serving-config: a version a rollout label names may be deleted", self.keep)
            return {}
        return versions_in_use(self.serving_config, model_name)


def versions_in_use(serving_config: Path, model_name: str) -> dict[int, list[str]]:
    """Version -> the reasons `serving_config` (a ModelServerConfig text proto) keeps it: `label stable`, ...,
    `the version policy`. A missing or malformed file is a one-line error."""
    config = parse_model_config(serving_config)
    models = {m.name: m for m in config.model_config_list.config}
    if model_name not in models:
        log.warning(
            "serving config %s has no model %r: none of its versions is in use there", serving_config, model_name
        )
        return {}
    model = models[model_name]
    reasons: dict[int, list[str]] = {}
    for label, version in sorted(model.version_labels.items()):
        reasons.setdefault(version, []).append(f"label {label}")
    if model.model_version_policy.WhichOneof("policy_choice") == "specific":
        for version in model.model_version_policy.specific.versions:
            reasons.setdefault(version, []).append("the version policy")
    return reasons


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


def publish_version(staged: Path, metadata: dict, retention: Retention | None = None) -> PublishedVersion:
    """Rename `staged` to the next free version number under its parent, then apply `retention`.

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
    if retention:
        _apply_retention(model_base, retention, version)
    return PublishedVersion(version, target)


def _apply_retention(model_base: Path, retention: Retention, published: int) -> None:
    # The config is read again now, not only before training: labels may have moved meanwhile.
    try:
        in_use = retention.versions_in_use(model_base.name)
    except TrainserveError as exc:  # it was readable before training: when in doubt, delete nothing
        log.warning("no version pruned (--keep %d): %s", retention.keep, exc)
        return
    prune_versions(model_base, retention.keep, protect=published, in_use=in_use)


def prune_versions(model_base: Path, keep: int, protect: int, in_use: dict[int, list[str]] | None = None) -> list[int]:
    """Delete all but the newest `keep` versions; `protect` (the new one) and the versions `in_use`
    (version -> why, from `versions_in_use`) are never deleted.

    Each old version is first renamed to a non-numeric name, so the server stops seeing it at once and
    never reads a half-deleted directory.
    """
    versions = numeric_versions(model_base)
    old = [v for v in versions[: max(0, len(versions) - keep)] if v != protect]
    in_use = in_use or {}
    for version in old:
        if version in in_use:
            log.info(
                "kept version %d (--keep %d): the serving config names it (%s)",
                version,
                keep,
                ", ".join(in_use[version]),
            )
    doomed = [v for v in old if v not in in_use]
    for version in doomed:
        trash = _staging_name(model_base)
        os.rename(model_base / str(version), trash)
        shutil.rmtree(trash, ignore_errors=True)
        log.info("pruned version %d (--keep %d)", version, keep)
    return doomed


def publish_or_discard(
    staged: Path, prepare: Callable[[Path], None], metadata: dict, retention: Retention | None
) -> PublishedVersion:
    """Fill and check the staged directory with `prepare`; publish it if that passes, else delete it."""
    try:
        prepare(staged)
        return publish_version(staged, metadata, retention)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
