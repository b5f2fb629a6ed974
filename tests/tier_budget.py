"""The quick tier stays quick: a `unit` test that takes more than its budget fails, with its name and its time, so
`make test-fast` cannot grow slow one test at a time and a test that outgrows the tier is moved (to
`integration`) or made quicker the day it lands. A test of the other tiers over the suite's budget (60 s) is
listed at the end of the run, with its time: seen the day it lands, not failed for a busy machine.

A test's time is its setup and call, less what fixtures of a wider scope took to set up (the first test to ask for
the trained digits or a served model pays for every later one; that cost is the fixture's, not the test's). It is
measured twice: in seconds of this process's CPU, which a busy machine (xdist workers side by side, CI neighbours)
does not stretch, and in wall seconds against a looser budget, which catches a test that waits instead of
computing. Both budgets leave room for a CPU without AVX-512, on which TensorFlow's kernels run up to 3x slower.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field

import pytest


@dataclass(frozen=True)
class Budget:
    cpu_s: float  # seconds of this process's CPU (all its threads)
    wall_s: float
    fails: bool  # a test over it fails; else it is listed at the end of the run


# The unit tier's whole budget is 90 s on two cores: about 1,200 tests at a tenth of a second each on average.
# One test may take a few of them; more belongs to another tier. No other test may take more than a minute.
BUDGETS = {
    "unit": Budget(cpu_s=4.0, wall_s=15.0, fails=True),
    "integration": Budget(cpu_s=math.inf, wall_s=60.0, fails=False),
    "e2e": Budget(cpu_s=math.inf, wall_s=60.0, fails=False),
}


@dataclass
class Spent:
    cpu_s: float = 0.0
    wall_s: float = 0.0

    def add(self, cpu_s: float, wall_s: float) -> None:
        self.cpu_s += cpu_s
        self.wall_s += wall_s


@dataclass
class Stopwatch:
    """What one test spent so far, and what its wider fixtures spent, which is subtracted."""

    spent: Spent = field(default_factory=Spent)
    shared: Spent = field(default_factory=Spent)


def pytest_collection_finish(session):
    """TensorFlow's and Keras' first use in a process (the first op, the first traced function, the first layer)
    costs seconds that one test would pay for all; where the tests import trainserve or TensorFlow, this process
    pays it before any test runs."""
    if {"tensorflow", "trainserve"} & sys.modules.keys() and any(tier_of(item) == "unit" for item in session.items):
        import keras
        import tensorflow as tf

        tf.function(lambda x: x + 1)(tf.constant(1))
        keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])(tf.zeros((1, 2)))


def tier_of(item: pytest.Item) -> str | None:
    return next((m.name for m in item.iter_markers() if m.name in BUDGETS), None)


def _clocks() -> tuple[float, float]:
    return time.process_time(), time.perf_counter()


_running: dict[str, Stopwatch] = {}  # the test being set up or run in this process: its nodeid -> its stopwatch


_wide_depth = [0]  # wider fixtures being set up, one inside another: only the outermost one's time is counted


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    if fixturedef.scope == "function":
        yield
        return
    cpu, wall = _clocks()
    _wide_depth[0] += 1
    try:
        yield
    finally:
        _wide_depth[0] -= 1
    if _wide_depth[0] == 0:
        now_cpu, now_wall = _clocks()
        for watch in _running.values():
            watch.shared.add(now_cpu - cpu, now_wall - wall)


def _timed(item: pytest.Item):
    watch = _running.setdefault(item.nodeid, Stopwatch())
    cpu, wall = _clocks()
    yield
    now_cpu, now_wall = _clocks()
    watch.spent.add(now_cpu - cpu, now_wall - wall)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    yield from _timed(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield from _timed(item)


def over_budget(tier: str, watch: Stopwatch) -> str | None:
    """Why the test broke its tier's budget; None where it did not."""
    budget = BUDGETS[tier]
    cpu_s = watch.spent.cpu_s - watch.shared.cpu_s
    wall_s = watch.spent.wall_s - watch.shared.wall_s
    if cpu_s <= budget.cpu_s and wall_s <= budget.wall_s:
        return None
    if not budget.fails:
        return f"{wall_s:.0f} s, over the {budget.wall_s:g} s a test of any tier may take"
    return (
        f"over the {tier} tier's budget: {cpu_s:.1f} s of CPU (at most {budget.cpu_s:g}) and {wall_s:.1f} s of "
        f"wall time (at most {budget.wall_s:g}), wider fixtures' setup left out; make it quicker or give it the "
        "tier it needs (tests/tier_budget.py)"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    tier = tier_of(item)
    if call.when == "teardown":
        _running.pop(item.nodeid, None)
    if call.when != "call" or tier is None or not report.passed:
        return
    if (why := over_budget(tier, _running[item.nodeid])) is None:
        return
    if BUDGETS[tier].fails:
        report.outcome = "failed"
        report.longrepr = f"{item.nodeid}: {why}"
    else:  # a user property travels with the report from an xdist worker to the terminal summary
        report.user_properties.append(("over_budget", why))


_listed: list[tuple[str, str]] = []


def pytest_runtest_logreport(report):
    _listed.extend((report.nodeid, why) for name, why in report.user_properties if name == "over_budget")


def pytest_terminal_summary(terminalreporter):
    if _listed:
        terminalreporter.section("tests over budget (tests/tier_budget.py)")
        for nodeid, why in _listed:
            terminalreporter.line(f"{nodeid}: {why}")
