"""What each look at a step says to a person: one log line naming, for each check, whether it passed or failed
and, while it waits, what for: its units so far and about how many it needs (its counts grown as they have grown,
every count alike, until the controller's own check would pass them), its bounds against its budget, and about how
long that takes at the step's rate so far. Where a terminal is attached, a progress bar over the step's duration
carries the same words.

    slow_calls: 1,210 of about 2,600 candidate calls timed, bounds [-0.0040, +0.0310] vs budget +0.0100, about 14m
"""

from __future__ import annotations

import logging

from trainserve.rollout import analysis
from trainserve.rollout.analysis import Check
from trainserve.rollout.measure import Look
from trainserve.rollout.plan import Step
from trainserve.rollout.rollout_config import StepGate
from trainserve.rollout.sizing.choose import hours
from trainserve.terminal import on_terminal, progress_bar

log = logging.getLogger("trainserve.rollout.controller")
MAX_GROWTH = 1000.0  # a check that would not pass on a thousand times its counts is not waiting for more of them


def units_needed(check: Check, step: Step, flips: bool, counts: dict, gate: StepGate, offline: dict) -> float | None:
    """The units at which `check` would pass, its counts grown alike (None: it would not, whatever it saw)."""
    if not check.seen:
        return None

    def passes(growth: float) -> bool:
        grown = {key: value * growth for key, value in counts.items()}
        found = analysis.checks(step, flips, grown, gate, offline)
        return next(c for c in found if c.name == check.name).result == analysis.PASS

    if not passes(MAX_GROWTH):
        return None
    low, high = 1.0, MAX_GROWTH
    while high / low > 1.02:
        middle = (low * high) ** 0.5
        low, high = (low, middle) if passes(middle) else (middle, high)
    return check.seen * high


def check_words(check: Check, needed: float | None, per_second: float) -> str:
    """One check at one look, as a person reads it."""
    if check.low is None:
        return f"{check.name}: {check.said}"
    bounds = f"bounds [{check.low:+.4f}, {check.high:+.4f}] vs budget {check.budget:+.4f}"
    if check.result == analysis.PASS:
        return f"{check.name}: passed, {bounds}"
    if check.result == analysis.FAIL:
        return f"{check.name}: FAILED, {bounds} ({check.seen:,.0f} {check.unit})"
    if needed is None:
        return f"{check.name}: {check.seen:,.0f} {check.unit}, {bounds}: not within it at the shares seen so far"
    wait = f", about {hours((needed - check.seen) / per_second)} at the current rate" if per_second > 0 else ""
    return f"{check.name}: {check.seen:,.0f} of about {needed:,.0f} {check.unit}, {bounds}{wait}"


class Narrator:
    """The lines and the progress bar of one model's rollout."""

    def __init__(self, model: str, gate: StepGate):
        self.model, self.gate = model, gate
        self.bar, self.bar_step = None, None

    def look(
        self,
        index: int,
        step: Step,
        flips: bool,
        offline: dict,
        look: Look,
        found: list[Check],
        decision: str,
        elapsed: float,
    ) -> None:
        """Log one look's decision and its words; move the bar to `elapsed`."""
        words = []
        for check in found:
            needed = None
            if check.result == analysis.UNKNOWN and check.low is not None:
                needed = units_needed(check, step, flips, look.counts, self.gate, offline)
            words.append(check_words(check, needed, (check.seen or 0) / elapsed if elapsed > 0 else 0.0))
        words += [look.unjudged] if look.unjudged else []
        log.info("model %s step %d (%s): %s: %s", self.model, index + 1, step.words(), decision, "; ".join(words))
        self._progress(index, step, elapsed, words)

    def _progress(self, index: int, step: Step, elapsed: float, words: list[str]) -> None:
        if not on_terminal():
            return
        if self.bar_step != index:
            self.close()
            self.bar = progress_bar(round(step.seconds), "s", f"step {index + 1} ({step.words()})", True)
            self.bar_step = index
        self.bar.n = min(round(elapsed), self.bar.total)
        self.bar.set_postfix_str("; ".join(w for w in words if ": passed" not in w)[:160], refresh=True)

    def __enter__(self) -> Narrator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar, self.bar_step = None, None
