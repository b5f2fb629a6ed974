"""Atomic publishing: numbering, pruning, SIGKILL at random moments, and racing publishers."""

from __future__ import annotations

import filecmp
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainserve.errors import TrainserveError
from trainserve.layout import STAGING_PREFIX, numeric_versions
from trainserve.training.publish import prune_versions, publish_or_discard, staging_dir

HELPER = Path(__file__).with_name("publish_loop.py")


def _publish_copy(template: Path, model_base: Path, **kwargs) -> tuple[int, Path]:
    import shutil

    return publish_or_discard(
        staging_dir(model_base),
        lambda p: shutil.copytree(template, p, dirs_exist_ok=True),
        {"model_name": "t"},
        **kwargs,
    )


def assert_complete(version_dir: Path, template: Path) -> None:
    """Every file of the template is there with identical bytes, and the metadata names this version."""
    cmp = filecmp.dircmp(template, version_dir)
    stack = [cmp]
    while stack:
        c = stack.pop()
        assert not c.left_only, f"{version_dir} lacks {c.left_only}"
        _, mismatch, errors = filecmp.cmpfiles(c.left, c.right, c.common_files, shallow=False)
        assert not mismatch and not errors, f"{version_dir}: differs in {mismatch + errors}"
        stack.extend(c.subdirs.values())
    meta = json.loads((version_dir / "assets.extra" / "trainserve.json").read_text())
    assert meta["version"] == int(version_dir.name)


@pytest.mark.unit
def test_versions_count_up_and_ignore_non_numeric(tiny_savedmodel, tmp_path):
    base = tmp_path / "m"
    (base / ".tmp-other").mkdir(parents=True)
    (base / "notes").mkdir()
    assert [_publish_copy(tiny_savedmodel, base, keep=None)[0] for _ in range(3)] == [1, 2, 3]
    assert numeric_versions(base) == [1, 2, 3]
    for v in (1, 2, 3):
        assert_complete(base / str(v), tiny_savedmodel)


@pytest.mark.unit
def test_keep_prunes_old_versions_never_the_new_one(tiny_savedmodel, tmp_path):
    base = tmp_path / "m"
    for _ in range(3):
        _publish_copy(tiny_savedmodel, base, keep=2)
    assert numeric_versions(base) == [2, 3]
    assert not list(base.glob(f"{STAGING_PREFIX}*")), "pruned versions leave no trash behind"
    assert prune_versions(base, keep=1, protect=2) == [], "the protected version survives even when oldest"


@pytest.mark.unit
def test_failed_prepare_publishes_nothing(tiny_savedmodel, tmp_path):
    base = tmp_path / "m"

    def broken(path: Path) -> None:
        (path / "saved_model.pb").write_bytes(b"half")
        raise TrainserveError("gate said no")

    with pytest.raises(TrainserveError, match="gate said no"):
        publish_or_discard(staging_dir(base), broken, {}, None)
    assert list(base.iterdir()) == []


@pytest.mark.unit
def test_unwritable_export_dir_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(TrainserveError, match="cannot write to export directory .*expected a writable directory"):
        staging_dir(blocker / "model")


@pytest.mark.integration
def test_sigkill_during_publishing_never_leaves_an_incomplete_version(tiny_savedmodel, tmp_path):
    base = tmp_path / "m"
    rng = random.Random(7)
    for _ in range(25):
        proc = subprocess.Popen(
            [sys.executable, str(HELPER), str(tiny_savedmodel), str(base), "1000"], stdout=subprocess.DEVNULL
        )
        time.sleep(rng.uniform(0.3, 1.2))  # imports take ~0.3 s; then it publishes continuously
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        for version in numeric_versions(base):
            assert_complete(base / str(version), tiny_savedmodel)
    killed_mid_publish = list(base.glob(f"{STAGING_PREFIX}*"))
    before = numeric_versions(base)
    assert before, "the loop published at least some versions between kills"
    version, _ = _publish_copy(tiny_savedmodel, base, keep=None)
    assert version == before[-1] + 1
    assert_complete(base / str(version), tiny_savedmodel)
    assert not list(base.glob(f"{STAGING_PREFIX}*")), f"stale staging dirs not cleaned: {killed_mid_publish}"


@pytest.mark.integration
def test_racing_publishers_get_distinct_numbers(tiny_savedmodel, tmp_path):
    base = tmp_path / "m"
    procs = [
        subprocess.Popen(
            [sys.executable, str(HELPER), str(tiny_savedmodel), str(base), "15"], stdout=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    got = [int(line) for p in procs for line in p.communicate(timeout=120)[0].split()]
    assert all(p.returncode == 0 for p in procs)
    assert sorted(got) == list(range(1, 46)), "45 publishes, 45 different numbers, no gaps"
    for version in numeric_versions(base):
        assert_complete(base / str(version), tiny_savedmodel)
    assert sorted(os.listdir(base)) == sorted(str(v) for v in range(1, 46)), "no staging dir left behind"
