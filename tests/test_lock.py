"""Reproducible installs: every dependency locked, the lock current, each image installing from it."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, pinned_tf_version

BIN = Path(sys.executable).parent
IMAGES_FROM_LOCK = {"eval": "requirements/eval.txt", "train-gpu": "requirements/train-gpu.txt"}


def test_lock_and_exports_are_what_make_lock_produces(tmp_path):
    """Edit pyproject.toml without `make lock`, or hand-edit requirements/, and this fails."""
    for name in ("Makefile", "pyproject.toml", "uv.lock", "README.md"):
        shutil.copy(REPO / name, tmp_path / name)
    shutil.copytree(REPO / "requirements", tmp_path / "requirements")
    proc = subprocess.run(["make", "-s", "lock", f"BIN={BIN}"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    for path in ["uv.lock", *sorted(str(p.relative_to(REPO)) for p in (REPO / "requirements").glob("*.txt"))]:
        assert (tmp_path / path).read_text() == (REPO / path).read_text(), f"{path} is stale: run `make lock`"


def test_one_tensorflow_and_protos_of_the_same_version():
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.distribution("tensorflow")  # the full wheel beside tensorflow-cpu: two TensorFlows
    assert importlib.metadata.version("tensorflow-cpu") == pinned_tf_version()
    assert importlib.metadata.version("tensorflow-serving-api") == pinned_tf_version()


def test_installed_versions_are_the_locked_ones():
    import tomllib

    locked: dict[str, set[str]] = {}  # a universal lock may hold one version per Python range
    for package in tomllib.loads((REPO / "uv.lock").read_text())["package"]:
        locked.setdefault(package["name"], set()).add(package["version"])
    installed = {d.metadata["Name"].lower().replace("_", "-"): d.version for d in importlib.metadata.distributions()}
    drift = {
        name: installed[name]
        for name, versions in locked.items()
        if installed.get(name, next(iter(versions))) not in versions
    }
    assert not drift, f"installed != locked (run `make venv`): {drift}"


@pytest.mark.parametrize("image", sorted(IMAGES_FROM_LOCK))
def test_images_install_the_locked_export_with_hashes(image):
    dockerfile = (REPO / "images" / image / "Dockerfile").read_text()
    assert f"COPY {IMAGES_FROM_LOCK[image]} " in dockerfile
    assert "--no-deps --require-hashes -r requirements.txt" in dockerfile
    assert "tomllib" not in dockerfile, "dependencies come from the lock, not re-resolved from pyproject.toml"
