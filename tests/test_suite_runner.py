"""How `make test` runs the suite: the Docker tests, marked `xdist_group("docker")`, must all land on one xdist
worker (`--dist loadgroup`), so that one worker builds the images and drives the engine while the others run the
rest. pytest 9.2 with pytest-xdist 3.8 broke this without a word (pytest-xdist#1386); this is the canary."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit  # a pytest subprocess that imports nothing of ours

GROUPED = """
import pytest
pytestmark = pytest.mark.xdist_group("docker")
@pytest.mark.parametrize("i", range(4))
def test_grouped(i):
    pass
"""
FREE = """
import pytest
@pytest.mark.parametrize("i", range(12))
def test_free(i):
    pass
"""


def test_the_docker_group_runs_on_one_worker(tmp_path):
    (tmp_path / "test_one.py").write_text(GROUPED)
    (tmp_path / "test_two.py").write_text(GROUPED)
    (tmp_path / "test_free.py").write_text(FREE)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "3", "--dist", "loadgroup", "-v"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    ran = re.findall(r"^\[(gw\d+)\] .*PASSED (test_\w+)\.py", proc.stdout, re.MULTILINE)
    grouped = {worker for worker, module in ran if module in ("test_one", "test_two")}
    assert len(ran) == 20 and len(grouped) == 1, f"the group ran on {sorted(grouped)}:\n{proc.stdout[-3000:]}"
