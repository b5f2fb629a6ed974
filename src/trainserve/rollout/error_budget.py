"""The error checks' budget: --gate-max-error-increase points above stable's error share, or, where larger,
--gate-max-relative-error-increase of stable's own share, so that an outage failing both versions alike is
judged on what the candidate adds to it.

A budget of a fixed number of points is hard to show near a high error share: the difference's variance grows
with p(1 - p), and at stable's 30 % a 1-point budget needs more than 8 hours of canary traffic at 10 requests/s,
whereas a candidate failing 10 % more of its requests than stable shows it within minutes. Kayenta's canary judge
states its thresholds the same way, relative to the baseline (an allowed increase of 10 % is a ratio of 1.1).

Stable's share is not known, only bounded: by the confidence sequence the difference's bounds already take it from
(trainserve.stats.sequential.difference_sequence, at the rest of the check's alpha). A check passes with the budget
at stable's lower bound and fails only beyond the budget at its upper bound, so both verdicts hold for every share
stable's counts allow, at the check's alpha: nothing is spent on the budget itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trainserve.rollout.rollout_config import StepGate
from trainserve.stats.sequential import confidence_sequence, difference_sequence

Bounds = Callable[[int], tuple[float, float]]  # a quantity's bounds with n units seen


@dataclass(frozen=True)
class ErrorBudget:
    """The budget a check passes within, and the bounds it is judged on: the difference's, its lower end lowered by
    what the budget could grow to at stable's upper bound (so that `low > budget` shows it beyond every budget)."""

    budget: float
    bounds: Bounds
    said: str  # why the budget is what it is, where stable's share sets it; else ""


def error_budget(events: int, stable: tuple[int, int], gate: StepGate, alpha_share: float) -> ErrorBudget:
    """The budget and bounds of `events` (among the n the bounds are asked for) against stable's (errors,
    requests); `alpha_share`: the candidate's share of the check's alpha, the rest bounding stable's share."""
    low, high = confidence_sequence(*stable, gate.alpha * (1 - alpha_share))
    budget, largest = _budget_at(low, gate), _budget_at(high, gate)

    def bounds(n: int) -> tuple[float, float]:
        below, above = difference_sequence((events, n), stable, gate.alpha, alpha_share)
        return below - (largest - budget), above

    said = ""
    if budget > gate.max_error_increase:
        said = f" (budget {gate.max_relative_error_increase:g} x stable's error share, at least {low:.4f})"
    return ErrorBudget(budget, bounds, said)


def _budget_at(stable_share: float, gate: StepGate) -> float:
    return max(gate.max_error_increase, gate.max_relative_error_increase * stable_share)
