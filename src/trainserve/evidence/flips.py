"""The decision a replay report's counts support: the flip rate and its one-sided upper bound, derived from the
flip matrix the report stores, and the `--max-flip-rate` gate judged on that bound; each side's error share,
derived from the error counts the report stores, and the `--max-error-rate` gate judged on it.

Replay writes its gates through this module, `replay-merge` derives them again from the summed counts, and promote
derives them once more rather than trusting the report's `passed`: a flip rate, bound, error share or verdict that
the counts do not give is refused, as an eval gate whose numbers disagree with it is.

Errors are evidence. A request one side failed was not compared, so a candidate that fails most of its requests
(unloaded mid-replay, a graph that rejects some inputs) would otherwise pass on the few it answered. A side's own
errors are its failed requests less those both sides refused as INVALID_ARGUMENT (a client's malformed request,
refused in production too: no difference between the versions). The gate is on the plain share, not on an upper
bound: an error is an observed failure of this run rather than an estimate of a rare rate, and a bound would fail
every small, error-free replay (0 errors in 50 requests has a 95 % Wilson bound of 0.05); the flip gate carries the
statistical claim.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainserve.stats.proportions import wilson_upper

FLIP_GATE = "max_flip_rate"
ERROR_GATE = "max_error_rate"
SIDES = ("candidate", "baseline")
SHARED_REFUSAL = "INVALID_ARGUMENT"  # both sides refusing a request this way: the request's fault, not a version's


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


@dataclass(frozen=True)
class ErrorShares:
    """Each side's own errors (by status and in all) of the requests replayed."""

    requests: int
    by_status: dict[str, dict[str, int]]  # side -> status -> requests
    refused_by_both: int

    def own(self, side: str) -> int:
        return sum(self.by_status[side].values()) - self.refused_by_both

    def share(self, side: str) -> float:
        return self.own(side) / self.requests if self.requests else 0.0


def error_shares(tally: dict) -> ErrorShares:
    """From a report's stored tally: its error counts per side and status, and the pairs both sides refused."""
    errors = {side: {k: int(v) for k, v in tally["errors"][side].items()} for side in SIDES}
    return ErrorShares(int(tally["requests"]), errors, int(tally.get("refused_by_both", 0)))


def error_gate(shares: ErrorShares, threshold: float) -> dict:
    """Fails when either side's own error share exceeds `threshold`."""
    values = {side: shares.share(side) for side in SIDES}
    passed = all(v <= threshold for v in values.values())

    def side_said(side: str) -> str:
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(shares.by_status[side].items()))
        return (
            f"{side} {shares.own(side)} of {shares.requests} ({values[side]:.4f}{': ' + statuses if statuses else ''})"
        )

    both = (
        f", {shares.refused_by_both} refused by both as {SHARED_REFUSAL} not counted" if shares.refused_by_both else ""
    )
    said = (
        f"error share {side_said('candidate')}, {side_said('baseline')}{both}: "
        f"{'each <=' if passed else 'above'} max {threshold:g}"
    )
    value = max(values.values())
    return {"kind": ERROR_GATE, "threshold": threshold, "value": value, "passed": passed, "said": said}


def verdict(gates: list[dict]) -> bool | None:
    """A report's `passed`: false when a gate failed, true only when the flip gate (the one that says the candidate
    answers as the baseline does) was applied and every gate held, null when nothing was judged."""
    if any(not g["passed"] for g in gates):
        return False
    return True if any(g["kind"] == FLIP_GATE for g in gates) else None


def replay_failures(report: dict) -> list[str]:
    """Why a replay report does not support promotion, from its counts (empty: its gates hold)."""
    gates = report.get("gates") or []
    failures = _error_failures(report, gates)
    if report.get("task") == "regression":  # nothing to flip: its error gate, and its differences anchor a rollout
        return failures
    if not any(g["kind"] == FLIP_GATE for g in gates):
        return [*failures, "it applied no flip-rate gate (expected trainserve replay --max-flip-rate)"]
    flips = report.get("flips")
    if flips is None:
        return [*failures, "it holds no flips (a regression model's replay has no flip-rate gate to judge)"]
    rate = flip_rate(report["tally"]["flip_matrix"], report["settings"]["alpha"])
    recorded = (flips.get("count"), flips.get("examples"), flips.get("upper_bound"))
    if recorded != (rate.count, rate.examples, rate.upper_bound):
        return [
            *failures,
            f"its flips say {recorded[0]} of {recorded[1]} (bound {recorded[2]}) but its flip matrix gives "
            f"{rate.count} of {rate.examples} (bound {rate.upper_bound})",
        ]
    for gate in (g for g in gates if g["kind"] == FLIP_GATE):
        derived = flip_gate(rate, gate["threshold"], flips["bound"])
        if gate.get("value") != derived["value"] or gate.get("passed") != derived["passed"]:
            failures.append(
                f"gate max flip rate {gate['threshold']:g} says passed={gate.get('passed')} but its counts "
                f"say {derived['passed']}"
            )
        elif not derived["passed"]:
            failures.append(derived["said"])
    return failures


def _error_failures(report: dict, gates: list[dict]) -> list[str]:
    """The error gate judged again from the stored error counts: absent, contradicted or failed, it refuses."""
    stated = [g for g in gates if g["kind"] == ERROR_GATE]
    threshold = (report.get("settings") or {}).get("max_error_rate")
    if not stated or threshold is None:
        return ["it applied no error gate (expected a report of trainserve replay with --max-error-rate)"]
    derived = error_gate(error_shares(report["tally"]), threshold)
    if any(g.get("passed") != derived["passed"] or g.get("threshold") != threshold for g in stated):
        return [
            f"gate max error rate {threshold:g} says passed={stated[0].get('passed')} but its counts say "
            f"{derived['passed']} ({derived['said']})"
        ]
    return [] if derived["passed"] else [derived["said"]]
