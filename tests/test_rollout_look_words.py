"""What a look says to a person (trainserve.rollout.look_words): for a check that waits, the units it needs, found
by growing its counts until the controller's own check passes them, agree with an independent search on the
bounds; and the line names its bounds, its budget and the time left at the step's rate."""

from __future__ import annotations

import io
import logging
import sys

import pytest

from trainserve.rollout import analysis
from trainserve.rollout.look_words import Narrator, units_needed
from trainserve.rollout.measure import KEYS, Look
from trainserve.rollout.plan import CANARY, Step
from trainserve.rollout.rollout_config import StepGate
from trainserve.stats.sequential import difference_sequence

pytestmark = pytest.mark.unit

STEP = Step(CANARY, 5.0, 600.0)


def canary_counts(canary: int, share: float = 0.05, slow: float = 0.01, errors: float = 0.0) -> dict:
    stable = round(canary * (1 - share) / share)
    counts = dict.fromkeys(KEYS, 0)
    counts.update(
        canary_requests=canary,
        canary_errors=errors * canary,
        stable_requests=stable,
        stable_errors=errors * stable,
        candidate_latency_count=canary,
        candidate_slow=slow * canary,
        stable_latency_count=stable,
        stable_slow=slow * stable,
    )
    return counts


def independent_needed(share: float, budget: float, rate: float = 0.01) -> float:
    """The canary calls at which the slow-call difference's upper bound reaches the budget, searched on the bounds
    alone (no check, no growth)."""
    n = 100.0
    while True:
        stable = n * (1 - share) / share
        high = difference_sequence((rate * n, n), (rate * stable, stable), 0.05, analysis.CANARY_ALPHA)[1]
        if high <= budget:
            return n
        n *= 1.01


def test_a_waiting_slow_call_check_needs_what_the_bounds_say():
    gate, counts = StepGate(), canary_counts(1000)
    slow = next(c for c in analysis.checks(STEP, False, counts, gate, {}) if c.name == "slow_calls")
    assert slow.result == analysis.UNKNOWN
    needed = units_needed(slow, STEP, False, counts, gate, {})
    assert needed == pytest.approx(independent_needed(0.05, gate.max_slow_increase), rel=0.04)


def test_a_check_at_its_budget_waits_for_nothing_more():
    gate, counts = StepGate(), canary_counts(1000, slow=0.01)
    counts["candidate_slow"] = 0.03 * 1000  # 2 points above stable's: beyond the 1-point budget whatever comes
    slow = next(c for c in analysis.checks(STEP, False, counts, gate, {}) if c.name == "slow_calls")
    assert units_needed(slow, STEP, False, counts, gate, {}) is None


def test_the_look_line_says_what_each_check_waits_for(caplog):
    gate, counts = StepGate(), canary_counts(1000)
    found = analysis.checks(STEP, False, counts, gate, {})
    caplog.set_level(logging.INFO, logger="trainserve.rollout.controller")
    Narrator("m", gate).look(1, STEP, False, {}, Look(counts, {}, {}), found, analysis.WATCH, elapsed=100.0)
    line = caplog.records[-1].getMessage()
    assert line.startswith("model m step 2 (5% 600s): watch: ")
    slow = next(part for part in line.split("; ") if part.startswith("slow_calls"))
    assert "1,000 of about" in slow and "candidate calls timed" in slow and "vs budget +0.0100" in slow
    minutes = float(slow.split("about ")[2].split("m at the current rate")[0].split("h ")[-1])
    needed = independent_needed(0.05, gate.max_slow_increase)
    assert minutes == pytest.approx((needed - 1000) / 10 / 60, rel=0.1)  # 1,000 calls in 100 s: 10 a second


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_sees_the_step_as_a_progress_bar_with_what_it_waits_for(monkeypatch):
    gate, counts = StepGate(), canary_counts(1000)
    found = analysis.checks(STEP, False, counts, gate, {})
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with Narrator("m", gate) as narrator:
        narrator.look(1, STEP, False, {}, Look(counts, {}, {}), found, analysis.WATCH, elapsed=100.0)
        narrator.look(1, STEP, False, {}, Look(counts, {}, {}), found, analysis.WATCH, elapsed=300.0)
    shown = terminal.getvalue()
    assert "step 2 (5% 600s)" in shown and "300/600" in shown and "slow_calls: 1,000 of about" in shown
    assert "error_ratio: passed" not in shown  # the bar names what still waits
