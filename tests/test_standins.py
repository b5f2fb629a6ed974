"""The stand-in images copy TensorFlow and serve-local's dependencies from this environment instead of
downloading them (scripts/standins/site_files.py lists the files): what they copy must be exactly what the
lock pins, and complete enough for a fresh Python to import it."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from importlib.metadata import version
from pathlib import Path

import pytest

from conftest import REPO

SITE_FILES = REPO / "scripts" / "standins" / "site_files.py"


def site_files(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SITE_FILES, *args], capture_output=True, text=True, cwd=REPO)


@pytest.mark.integration
def test_tensorflow_and_what_it_requires_are_listed_at_the_pinned_versions():
    proc = site_files("requirements/serve.txt", "--closure-of", "tensorflow-cpu")
    assert proc.returncode == 0, proc.stderr
    files = proc.stdout.splitlines()
    tops = {f.split("/")[0] for f in files}
    assert f"tensorflow_cpu-{version('tensorflow-cpu')}.dist-info" in tops
    assert f"numpy-{version('numpy')}.dist-info" in tops
    assert "tensorflow_serving" not in tops  # serve-local's, not TensorFlow's
    assert not any(t.startswith(("pip", "setuptools")) for t in tops), "the image's venv keeps its own installer"
    site = Path(sysconfig.get_paths()["purelib"])
    assert all((site / f).exists() for f in files)


@pytest.mark.unit
def test_the_rest_of_serve_local_is_listed_without_tensorflow():
    proc = site_files("requirements/serve.txt", "--without-closure-of", "tensorflow-cpu")
    assert proc.returncode == 0, proc.stderr
    tops = {f.split("/")[0] for f in proc.stdout.splitlines()}
    assert "tensorflow_serving" in tops and "matplotlib" in tops
    assert "tensorflow" not in tops and "numpy" not in tops


@pytest.mark.unit
def test_a_package_installed_at_another_version_than_pinned_is_refused(tmp_path):
    lines = (REPO / "requirements" / "serve.txt").read_text().replace("numpy==", "numpy==0.0.", 1)
    (tmp_path / "serve.txt").write_text(lines)
    proc = site_files(str(tmp_path / "serve.txt"), "--closure-of", "tensorflow-cpu")
    assert proc.returncode != 0
    assert "numpy" in proc.stderr and "pins 0.0." in proc.stderr
