"""tests/tier_budget.py on a pytest of its own: a unit test over its budget fails with its name and its time; a
test that only waits on a wider fixture's setup passes; a test of another tier over its budget is listed at the
end, not failed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

CONFTEST = """
import time
import pytest
import tier_budget

pytest_plugins = ("tier_budget",)
tier_budget.BUDGETS["unit"] = tier_budget.Budget(cpu_s=0.1, wall_s=5.0, fails=True)
tier_budget.BUDGETS["integration"] = tier_budget.Budget(cpu_s=float("inf"), wall_s=0.2, fails=False)


def burn(cpu_s):
    began = time.process_time()
    while time.process_time() - began < cpu_s:
        pass


@pytest.fixture(scope="session")
def shared_and_slow():
    burn(0.3)


def pytest_configure(config):
    for tier in ("unit", "integration"):
        config.addinivalue_line("markers", tier)
"""

TESTS_FILE = """
import pytest
from conftest import burn


@pytest.mark.unit
def test_computes_too_long():
    burn(0.3)


@pytest.mark.unit
def test_only_waits_on_a_shared_fixture(shared_and_slow):
    pass


@pytest.mark.unit
def test_quick():
    pass


@pytest.mark.integration
def test_slow_in_a_tier_whose_budget_lists_it():
    burn(0.3)
"""


@pytest.mark.unit
def test_a_unit_test_over_its_budget_fails_naming_itself(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_timed.py").write_text(TESTS_FILE)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(TESTS), "PATH": "", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},  # quicker: no plugins
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = run.stdout
    assert run.returncode == 1, out + run.stderr
    assert "1 failed, 3 passed" in out, out
    (failed,) = [line for line in out.splitlines() if line.startswith("FAILED")]
    assert "test_timed.py::test_computes_too_long" in failed, out
    assert "over the unit tier's budget" in out and "s of CPU (at most 0.1)" in out, out
    listed = out.split("tests over budget")[1]
    # its seconds rounded: 0.3 s of CPU is 0 or 1 s of wall time, as busy as the machine is
    assert re.search(r"test_slow_in_a_tier_whose_budget_lists_it: \d+ s, over the 0.2 s a test of any tier may", listed)
    assert "test_quick" not in listed and "test_only_waits" not in listed, listed
