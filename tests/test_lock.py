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


@pytest.mark.integration
def test_lock_and_exports_are_what_make_lock_produces(tmp_path):
    """Edit pyproject.toml without `make lock`, or hand-edit requirements/, and this fails."""
    for name in ("Makefile", "pyproject.toml", "uv.lock", "README.md"):
        shutil.copy(REPO / name, tmp_path / name)
    shutil.copytree(REPO / "requirements", tmp_path / "requirements")
    proc = subprocess.run(["make", "-s", "lock", f"BIN={BIN}"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    for path in ["uv.lock", *sorted(str(p.relative_to(REPO)) for p in (REPO / "requirements").glob("*.txt"))]:
        assert (tmp_path / path).read_text() == (REPO / path).read_text(), f"{path} is stale: run `make lock`"


@pytest.mark.unit
def test_one_tensorflow_and_protos_of_the_same_version():
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.distribution("tensorflow")  # the full wheel beside tensorflow-cpu: two TensorFlows
    assert importlib.metadata.version("tensorflow-cpu") == pinned_tf_version()
    assert importlib.metadata.version("tensorflow-serving-api") == pinned_tf_version()


@pytest.mark.unit
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


def exported_packages(path: str) -> set[str]:
    return {line.split("==")[0] for line in (REPO / path).read_text().splitlines() if "==" in line}


@pytest.mark.unit
def test_the_core_install_and_the_eval_image_hold_no_tensorflow():
    """`pip install trainserve` is the eval client: TensorFlow and the training stack only come with extras."""
    import tomllib

    heavy = {"tensorflow", "tensorflow-cpu", "tensorflow-serving-api", "keras", "scikit-learn", "scipy", "tensorboard"}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core = {dep.split(">")[0].split("=")[0].split("<")[0] for dep in project["dependencies"]}
    assert not core & heavy, f"core dependencies must stay TensorFlow-free: {sorted(core & heavy)}"
    assert {"train", "serve", "cpu"} <= set(project["optional-dependencies"])
    assert not exported_packages("requirements/eval.txt") & heavy
    assert "tensorflow-serving-api" in exported_packages("requirements/serve.txt")


@pytest.mark.unit
@pytest.mark.parametrize("image", sorted(IMAGES_FROM_LOCK))
def test_images_install_the_locked_export_with_hashes(image):
    dockerfile = (REPO / "images" / image / "Dockerfile").read_text()
    assert f"COPY {IMAGES_FROM_LOCK[image]} " in dockerfile
    assert "--no-deps --require-hashes -r requirements.txt" in dockerfile
    assert "tomllib" not in dockerfile, "dependencies come from the lock, not re-resolved from pyproject.toml"
