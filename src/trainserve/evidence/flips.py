"""The decision a replay report's counts support: the flip rate and its one-sided upper bound, derived from the
flip matrix the report stores, and the `--max-flip-rate` gate judged on that bound.

Replay writes its gate through this module, `replay-merge` derives it again from the summed matrices, and promote
derives it once more rather than trusting the report's `passed`: a flip rate, bound or verdict that the matrix
does not give is refused, as an eval gate whose numbers disagree with it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainserve.stats.proportions import wilson_upper

FLIP_GATE = "max_flip_rate"


@dataclass(frozen=True)
class FlipRate:
    """Examples whose top class differs between the two versions, of all compared, and the rate's bound."""

    count: int
    examples: int
    upper_bound: float

    @property
    def rate(self) -> float:
        return self.count / self.examples if self.examples else 0.0


def flip_rate(matrix, alpha: float) -> FlipRate:
    """From the [baseline class, candidate class] counts: off the diagonal is a flip."""
    counts = np.asarray(matrix, np.int64)
    count, examples = int(counts.sum() - np.trace(counts)), int(counts.sum())
    return FlipRate(count, examples, wilson_upper(count, examples, alpha))


def flip_gate(rate: FlipRate, threshold: float, bound: str) -> dict:
    """The gate on the bound, not on the rate: a small sample never passes for want of flips seen."""
    passed = rate.examples > 0 and rate.upper_bound <= threshold
    said = (
        f"flip rate {rate.rate:.4f} ({rate.count} of {rate.examples}), {bound} upper bound "
        f"{rate.upper_bound:.4f} {'<=' if passed else '>'} max {threshold:g}"
    )
    return {"kind": FLIP_GATE, "threshold": threshold, "value": rate.upper_bound, "passed": passed, "said": said}


def replay_failures(report: dict) -> list[str]:
    """Why a replay report does not support promotion, from its counts (empty: its flip gate holds)."""
    gates = report.get("gates") or []
    if not gates:
        return ["it applied no gate (expected trainserve replay --max-flip-rate)"]
    flips = report.get("flips")
    if flips is None:
        return ["it holds no flips (a regression model's replay has no flip-rate gate to judge)"]
    rate = flip_rate(report["tally"]["flip_matrix"], report["settings"]["alpha"])
    recorded = (flips.get("count"), flips.get("examples"), flips.get("upper_bound"))
    if recorded != (rate.count, rate.examples, rate.upper_bound):
        return [
            f"its flips say {recorded[0]} of {recorded[1]} (bound {recorded[2]}) but its flip matrix gives "
            f"{rate.count} of {rate.examples} (bound {rate.upper_bound})"
        ]
    failures = []
    for gate in gates:
        derived = flip_gate(rate, gate["threshold"], flips["bound"])
        if gate.get("value") != derived["value"] or gate.get("passed") != derived["passed"]:
            failures.append(
                f"gate max flip rate {gate['threshold']:g} says passed={gate.get('passed')} but its counts "
                f"say {derived['passed']}"
            )
        elif not derived["passed"]:
            failures.append(derived["said"])
    return failures
