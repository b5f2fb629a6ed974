"""Gates that judge a version against the one it would replace: change thresholds and "not significantly worse".

A change threshold has TFMA's meaning (`GenericChangeThreshold`): the direction comes from the metric, higher is
better for accuracy, lower for loss, MSE, RMSE and MAE, and the threshold bounds the change in that direction:
`accuracy>=-0.005` lets accuracy fall by at most half a point, `loss<=0.01` lets the loss rise by at most 0.01;
`accuracy>=-1%` and `mse<=2%` are relative to the baseline's value. The op must agree with the direction (a
`accuracy<=...` change threshold would reward a worse model), so a wrong one is refused, not obeyed.
Change thresholds judge point estimates, as TFMA's do (the report says so, with the interval beside them);
noninferiority.py's --max-drop is the form judged on the interval's end. The significance gate asks whether the
data shows a difference at all: absence of evidence passes it. Both kinds here pass on absence of evidence (the
report says so, `basis`), so promote refuses a comparison gated by them alone: a rollout's gate is --max-drop.
Value gates (`--require`, `--min-accuracy`) judge the candidate's own metrics.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import Literal

from trainserve.evidence.decision import ABSENCE, BOUND, basis_of, change_of, holds
from trainserve.margins import HIGHER_IS_BETTER, LOWER_IS_BETTER

# The metrics compared example by example (an interval, a change gate), by task; the first decides the verdict.
PAIRED_METRICS = {"classification": ("accuracy", "top_k_accuracy", "loss"), "regression": ("mse", "rmse", "mae")}
_GATE = re.compile(r"^\s*([a-z_0-9]+)\s*(>=|<=)\s*([-+0-9.eE]+)\s*$")
_CHANGE = re.compile(r"^\s*([a-z_0-9]+)\s*(>=|<=)\s*([-+0-9.eE]+)\s*(%?)\s*$")


@dataclass(frozen=True)
class Threshold:
    """`metric op threshold`, what every gate holds a number to."""

    metric: str
    op: Literal[">=", "<="]
    threshold: float

    def holds(self, value: float) -> bool:
        return holds(self.op, value, self.threshold)


@dataclass(frozen=True)
class Gate(Threshold):
    """`metric >= threshold` or `metric <= threshold` on the version's own metrics: the run passes only when
    every gate holds."""

    def judge(self, metrics: dict) -> dict:
        value = metrics.get(self.metric)
        holds = value is not None and self.holds(value)
        return {"metric": self.metric, "op": self.op, "threshold": self.threshold, "value": value, "passed": holds}

    def describe(self) -> str:
        return f"{self.metric} {self.op} {self.threshold:g}"


def parse_gates(text: str) -> tuple[Gate, ...]:
    """`accuracy>=0.9,loss<=0.3` -> gates."""
    gates = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        match = _GATE.match(item)
        if not match:
            raise argparse.ArgumentTypeError(f"{item!r}: expected METRIC>=VALUE or METRIC<=VALUE, e.g. r2>=0.5")
        gates.append(Gate(match[1], match[2], float(match[3])))  # type: ignore[arg-type]
    return tuple(gates)


@dataclass(frozen=True)
class ChangeGate(Threshold):
    """`metric op threshold` on the change candidate - baseline (relative: in % of the baseline's value)."""

    relative: bool = False

    def describe(self) -> str:
        return f"{self.metric} change {self.op} {self.threshold:+g}{'%' if self.relative else ''}"

    def judge(self, candidate: float, baseline: float, baseline_version: int) -> dict:
        change = change_of(candidate, baseline, self.relative)
        passed = self.holds(change)
        unit = "%" if self.relative else ""
        return {
            "kind": "change",
            "metric": self.metric,
            "op": self.op,
            "threshold": self.threshold,
            "relative": self.relative,
            "value": change,
            "candidate_value": candidate,
            "baseline_value": baseline,
            "baseline_version": baseline_version,
            "passed": passed,
            "said": f"{self.metric} changed by {change:+.4g}{unit} vs version {baseline_version}, expected "
            f"{self.op} {self.threshold:+g}{unit}",
        }


def parse_change_gates(text: str) -> tuple[ChangeGate, ...]:
    """`accuracy>=-0.005,loss<=1%` -> change gates, each op checked against its metric's direction."""
    gates = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        match = _CHANGE.match(item)
        if not match:
            raise argparse.ArgumentTypeError(
                f"{item!r}: expected METRIC>=CHANGE or METRIC<=CHANGE, absolute or in %, e.g. accuracy>=-0.005"
            )
        metric, op = match[1], match[2]
        wanted = ">=" if metric in HIGHER_IS_BETTER else "<=" if metric in LOWER_IS_BETTER else None
        if wanted is None:
            known = ", ".join(sorted(HIGHER_IS_BETTER | LOWER_IS_BETTER))
            raise argparse.ArgumentTypeError(f"{item!r}: no direction known for {metric!r}: expected one of {known}")
        if op != wanted:
            better = "higher" if wanted == ">=" else "lower"
            raise argparse.ArgumentTypeError(
                f"{item!r}: {better} {metric} is better, so its change threshold is {metric}{wanted}CHANGE"
            )
        gates.append(ChangeGate(metric, op, float(match[3]), bool(match[4])))  # type: ignore[arg-type]
    return tuple(gates)


def basis_note(gate: dict) -> str:
    """What a comparison gate's pass rests on, as its line ends: ` [bound]`, or ` [absence of evidence: cannot
    promote alone]` (promote needs a bound-based gate); nothing for a value gate."""
    basis = basis_of(gate)
    if basis == BOUND:
        return " [bound" + (", default margin]" if gate.get("default_margin") else "]")
    if basis == ABSENCE:
        return " [absence of evidence: cannot promote alone]"
    return ""


def not_worse_gate(comparison: dict, alpha: float) -> dict:
    """Passes unless the candidate is significantly worse than the baseline (its test's p < alpha)."""
    test, metric = comparison["test"], comparison["primary_metric"]
    worse = comparison["verdict"] == "worse"
    return {
        "kind": "significance",
        "metric": metric,
        "op": "not worse",
        "threshold": alpha,
        "value": test["p_value"],
        "interval": comparison["metrics"][metric]["interval"],
        "mdd": comparison["metrics"][metric].get("mdd"),
        "baseline_version": comparison["baseline"]["version"],
        "passed": not worse,
        "said": f"{metric} is significantly worse than version {comparison['baseline']['version']} "
        f"({test['name']}, p={test['p_value']:.3g} < {alpha:g})",
    }


def change_gates(gates: tuple[ChangeGate, ...], comparison: dict) -> list[dict]:
    """Each change gate judged on the comparison's point estimates."""
    metrics, version = comparison["metrics"], comparison["baseline"]["version"]
    judged = []
    for gate in gates:
        m = metrics[gate.metric]
        said = gate.judge(m["candidate"], m["baseline"], version)
        judged.append({**said, "estimate": "point estimate (TFMA)", "interval": m.get("interval"), "mdd": m.get("mdd")})
    return judged


def check_change_gates(gates: tuple[ChangeGate, ...], kind: str) -> str | None:
    """A one-line reason when a change gate names a metric this task does not compare example by example."""
    for gate in gates:
        if gate.metric not in PAIRED_METRICS[kind]:
            return (
                f"--require-vs-baseline {gate.describe()}: {kind} compares {', '.join(PAIRED_METRICS[kind])} "
                "example by example: expected one of those"
            )
    return None
