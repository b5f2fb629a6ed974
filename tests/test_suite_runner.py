"""How `make test` runs the suite: the Docker tests, marked `xdist_group("docker")`, must all land on one xdist
worker (`--dist loadgroup`), so that one worker builds the images and drives the engine while the others run the
rest; and that worker must start on them at once, as the longest chain of the suite. pytest 9.2 with pytest-xdist
3.8 broke the grouping without a word (pytest-xdist#1386), and xdist's default reordering of groups by size sent
the Docker group out only after three larger groups: this is the canary, run with the Makefile's own flags."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

# The unit tests here: a pytest subprocess that imports nothing of ours.

GROUPED = """
import pytest
pytestmark = pytest.mark.xdist_group("{group}")
@pytest.mark.parametrize("i", range({count}))
def test_grouped(i):
    pass
"""
FREE = """
import pytest
@pytest.mark.parametrize("i", range(12))
def test_free(i):
    pass
"""


def make_test_flags() -> list[str]:
    """`make test`'s xdist flags (PYTEST_PARALLEL) for three workers, as the Makefile spells them."""
    printed = subprocess.run(
        ["make", "--no-print-directory", "-s", "-f", "Makefile", "-f", "-", "print", "PYTEST_WORKERS=3"],
        input="print:\n\t@printf '%s\\n' '$(PYTEST_PARALLEL)'\n",
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return shlex.split(printed.stdout)


def run_suite(directory: Path) -> list[tuple[str, str]]:
    """Runs the fake suite in `directory` with `make test`'s flags; returns (worker, module) per test, in the
    order the tests finished (each worker runs its tests one after another)."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *make_test_flags(), "-v"],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    return re.findall(r"^\[(gw\d+)\] .*PASSED (test_\w+)\.py", proc.stdout, re.MULTILINE)


@pytest.mark.integration
def test_the_docker_group_runs_on_one_worker_and_goes_out_first(tmp_path):
    """conftest.py sorts the Docker tests first; xdist must keep them on one worker and hand their group out
    first, although three groups hold more tests (as the monitoring, two-trainings and compare modules do), so
    that the longest chain of the suite starts with the run, not after a worker has finished one of those."""
    (tmp_path / "test_a_docker_one.py").write_text(GROUPED.format(group="docker", count=4))
    (tmp_path / "test_a_docker_two.py").write_text(GROUPED.format(group="docker", count=4))
    for name in ("big1", "big2", "big3"):
        (tmp_path / f"test_b_{name}.py").write_text(GROUPED.format(group=name, count=10))
    (tmp_path / "test_free.py").write_text(FREE)
    ran = run_suite(tmp_path)
    grouped = {worker for worker, module in ran if module.startswith("test_a_docker")}
    assert len(ran) == 50 and len(grouped) == 1, f"the group ran on {sorted(grouped)}:\n{ran}"
    firsts = {worker: module for worker, module in reversed(ran)}  # each worker's first test
    assert firsts[grouped.pop()].startswith("test_a_docker"), f"the docker group was not its worker's first:\n{ran}"
