"""Atomic publishing: numbering, pruning, SIGKILL at random moments, and racing publishers."""

from __future__ import annotations

import filecmp
import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from google.protobuf import text_format

from trainserve.cli import main
from trainserve.errors import TrainserveError
from trainserve.layout import STAGING_PREFIX, numeric_versions
from trainserve.protos import model_server_config_pb2
from trainserve.training.publish import Retention, prune_versions, publish_or_discard, staging_dir

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
    assert [_publish_copy(tiny_savedmodel, base, retention=None)[0] for _ in range(3)] == [1, 2, 3]
    assert numeric_versions(base) == [1, 2, 3]
    for v in (1, 2, 3):
        assert_complete(base / str(v), tiny_savedmodel)


@pytest.mark.unit
def test_keep_prunes_old_versions_never_the_new_one(tiny_savedmodel, tmp_path):
    base = tmp_path / "m"
    for _ in range(3):
        _publish_copy(tiny_savedmodel, base, retention=Retention(keep=2))
    assert numeric_versions(base) == [2, 3]
    assert not list(base.glob(f"{STAGING_PREFIX}*")), "pruned versions leave no trash behind"
    assert prune_versions(base, keep=1, protect=2) == [], "the protected version survives even when oldest"


def _serving_config(path: Path, labels: dict[str, int], policy: list[int]) -> Path:
    """A ModelServerConfig as `trainserve candidate/promote` write it: model `m`, its labels and versions."""
    config = model_server_config_pb2.ModelServerConfig()
    model = config.model_config_list.config.add(name="m", base_path="/models/m", model_platform="tensorflow")
    model.version_labels.update(labels)
    model.model_version_policy.specific.versions.extend(policy)
    config.model_config_list.config.add(name="other", base_path="/models/other").version_labels["stable"] = 3
    path.write_text(text_format.MessageToString(config))
    return path


@pytest.mark.unit
def test_keep_never_deletes_a_version_the_serving_config_names(tiny_savedmodel, tmp_path, caplog):
    base = tmp_path / "m"
    for _ in range(4):
        _publish_copy(tiny_savedmodel, base, retention=None)
    config = _serving_config(tmp_path / "models.config", {"stable": 1, "previous": 2}, policy=[1, 2])
    caplog.set_level(logging.INFO, logger="trainserve.training.publish")
    caplog.clear()  # only the pruning publish: the four before it log too where an earlier test set INFO
    version, _ = _publish_copy(tiny_savedmodel, base, retention=Retention(keep=1, serving_config=config))
    assert numeric_versions(base) == [1, 2, version], "stable and previous survive --keep 1; 3 and 4 do not"
    assert "kept version 1 (--keep 1): the serving config names it (label stable, the version policy)" in caplog.text
    assert "kept version 2 (--keep 1): the serving config names it (label previous, the version policy)" in (
        caplog.text
    )
    assert "version 3" not in caplog.text.replace("pruned version 3", ""), "another model's label protects nothing"


@pytest.mark.unit
def test_keep_deletes_nothing_when_the_serving_config_breaks_after_training(tiny_savedmodel, tmp_path, caplog):
    base = tmp_path / "m"
    for _ in range(2):
        _publish_copy(tiny_savedmodel, base, retention=None)
    broken = tmp_path / "models.config"
    broken.write_text("model_config_list { config { name: ")
    _publish_copy(tiny_savedmodel, base, retention=Retention(keep=1, serving_config=broken))
    assert numeric_versions(base) == [1, 2, 3], "when in doubt, nothing is deleted"
    assert "no version pruned (--keep 1)" in caplog.text


@pytest.mark.parametrize(
    "config_text, fragment",
    [
        pytest.param(None, "cannot be read (No such file or directory)", id="missing"),
        pytest.param("model_config_list { config { nam", "expected a ModelServerConfig text proto", id="malformed"),
    ],
)
@pytest.mark.unit
def test_an_unreadable_serving_config_fails_before_training(config_text, fragment, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "models.config"
    if config_text is not None:
        config.write_text(config_text)
    code = main(["train", "--keep", "1", "--serving-config", str(config), "--data", "synthetic"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0].startswith("trainserve train: error: --serving-config: model config file") and fragment in err[0]
    assert not (tmp_path / "models").exists() and not (tmp_path / "logs").exists(), "nothing trained"


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
    # Each publisher is a fork of one helper process (a fresh Python each time cost most of the test's time).
    forks = subprocess.Popen(
        [sys.executable, str(HELPER), str(tiny_savedmodel), str(base), "forks"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    for _ in range(25):
        forks.stdin.write("start\n")
        forks.stdin.flush()
        publisher = int(forks.stdout.readline().split()[1])
        forks.stdout.readline()  # its first version is published: from now on it publishes continuously
        # A random moment to kill at, not a wait for anything: one publish takes a few ms, so 50 ms span many.
        time.sleep(rng.uniform(0, 0.05))
        os.kill(publisher, signal.SIGKILL)
        while not forks.stdout.readline().strip().endswith("ended"):  # the versions it printed, then its end
            pass
        for version in numeric_versions(base):
            assert_complete(base / str(version), tiny_savedmodel)
    forks.stdin.close()
    assert forks.wait(timeout=30) == 0
    killed_mid_publish = list(base.glob(f"{STAGING_PREFIX}*"))
    before = numeric_versions(base)
    assert before, "the loop published at least some versions between kills"
    version, _ = _publish_copy(tiny_savedmodel, base, retention=None)
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
