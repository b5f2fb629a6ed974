"""The decision an eval report's numbers support, re-derived from them: every gate judged again from the
metrics and the comparison the report holds, then the data check and the baseline's rows.

Eval writes `passed` through this module, `report merge` recomputes it here, and promote re-derives it here
rather than trusting the field: a report whose gates say "passed" while its numbers say otherwise (edited by
hand, or by a bug) is refused, not obeyed. A gate kind with no rule here cannot be re-derived and never passes.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

_OPS = {">=": operator.ge, "<=": operator.le}
# The report's evidence.kind: the version's own verified held-out split, data that holds rows it trained on, or
# neither known; evidence.baseline.rows: whether the baseline trained on the rows of the comparison.
OWN_SPLIT, UNVERIFIED, OVERLAPPING = "own-split", "unverified", "overlapping"
DISJOINT, UNKNOWN = "disjoint", "unknown"
COMPARISON_KINDS = ("change", "significance", "non-inferiority", "slice", "slice-non-inferiority")
# What a comparison gate's pass rests on. A bound: the interval's end lies inside a margin, so passing is evidence
# that the candidate is at most that much worse. Absence of evidence: no significant drop ("not significantly
# worse", no slice significantly worse) or a point estimate over a change threshold, which a small or noisy eval
# passes whatever the models do. Only a bound can promote (rollout.checks' `bound`); a per-slice margin
# (--max-drop-per-slice) is a bound on every slice.
BOUND, ABSENCE = "bound", "absence of evidence"
BOUND_KINDS = frozenset({"non-inferiority", "slice-non-inferiority"})


def basis_of(gate: dict) -> str | None:
    """`bound` or `absence of evidence` for a comparison gate, from its kind (None: a value gate)."""
    kind = gate.get("kind")
    if kind is None:
        return None
    return BOUND if kind in BOUND_KINDS else ABSENCE


def missing_bound(report: dict) -> str | None:
    """Why a report's comparison cannot promote for want of a bound-based gate (None: it has one, or it compared
    with no version): the words name the gates it did apply."""
    comparison = report.get("comparison") or {}
    version = (comparison.get("baseline") or {}).get("version")
    if version is None or not report.get("gates"):
        return None  # no gate at all is the `gates` check's refusal
    against = [g for g in report["gates"] if g.get("kind") is not None]
    if any(basis_of(g) == BOUND for g in against):
        return None
    applied = "no gate on the comparison"
    if against:
        applied = f"only {'; '.join(gate_words(g) for g in against)}: each passes on absence of evidence"
    return (
        f"its comparison with version {version} has no bound-based gate ({applied}): expected eval "
        "--compare-with with --max-drop METRIC=DROP (non-inferiority, the interval's end inside the margin)"
    )


def holds(op: str, value: float, threshold: float) -> bool:
    """`value op threshold` for the two ops a gate may carry."""
    return bool(_OPS[op](value, threshold))


def change_of(candidate: float, baseline: float, relative: bool) -> float:
    """candidate - baseline, or in % of the baseline's value (TFMA's relative change threshold)."""
    change = candidate - baseline
    if not relative or change == 0:
        return 0.0 if change == 0 else change
    return change / abs(baseline) * 100 if baseline else float("inf") * change


def significantly_worse(metric: dict, p_value: float, alpha: float) -> bool:
    """The comparison's verdict "worse": p below alpha and the difference in the worse direction."""
    if p_value >= alpha or metric["difference"] == 0:
        return False
    return metric["difference"] < 0 if metric["higher_is_better"] else metric["difference"] > 0


def non_inferiority(low: float | None, high: float | None, margin: float) -> str:
    """Non-inferior, inferior or inconclusive, from the interval [low, high] of the change in the better
    direction (the "gain"): inside the margin only when its lower end lies above -margin."""
    if low is None or high is None:
        return "inconclusive"  # no interval (too few examples): nothing is proven
    if low > -margin:
        return "non-inferior"
    if high < -margin:
        return "inferior"
    return "inconclusive"


def gain_interval(metric: dict) -> tuple[float | None, float | None]:
    """The interval of a comparison metric's change, turned so that better is positive."""
    low, high = metric["interval"]
    if metric["higher_is_better"] or low is None or high is None:
        return low, high
    return -high, -low


def metric_verdict(metric: dict, margin: float) -> str:
    """A comparison metric's non-inferiority verdict: from its gain's interval, but never non-inferior where its
    `tail` check found the errors' tail too heavy to trust the bound (trainserve.stats.tails)."""
    verdict = non_inferiority(*gain_interval(metric), margin)
    if verdict == "non-inferior" and not (metric.get("tail") or {}).get("enough", True):
        return "inconclusive"
    return verdict


def margin_of(gate: dict, metric: dict) -> float:
    """A non-inferiority gate's margin in the metric's units: its threshold, or that % of the baseline's value."""
    return gate["threshold"] / 100 * abs(metric["baseline"]) if gate.get("relative") else gate["threshold"]


def _non_inferior(gate: dict, metric: dict | None) -> bool | None:
    """Re-derived from the comparison's interval and the gate's own margin: the recorded bound and verdict must
    be the ones the numbers give."""
    if metric is None or gate.get("margin") != margin_of(gate, metric):
        return None
    low, verdict = gain_interval(metric)[0], metric_verdict(metric, gate["margin"])
    if gate.get("value") != low or gate.get("verdict") != verdict:
        return None
    return verdict == "non-inferior"


def _slices_not_worse(gate: dict, comparison: dict) -> bool | None:
    """A slice gate: re-derived from the slice table, each slice's corrected p-value against alpha."""
    table = comparison.get("slices") or {}
    if table.get("correction") != gate.get("correction") or table.get("alpha") != gate.get("threshold"):
        return None
    worse = [
        s["name"]
        for s in table.get("rows", [])
        if s.get("p_adjusted") is not None and s["p_adjusted"] < gate["threshold"] and s.get("direction") == "worse"
    ]
    if sorted(worse) != sorted(gate.get("slices", [])) or gate.get("value") != len(worse):
        return None
    return not worse


def _slices_non_inferior(gate: dict, comparison: dict) -> bool | None:
    """A per-slice non-inferiority gate: each slice judged again from its recorded interval and the gate's own
    margin (a relative one in % of that slice's baseline value); the slices named as failing must be those."""
    table = comparison.get("slices") or {}
    recorded = table.get("margin") or {}
    if (recorded.get("threshold"), recorded.get("relative")) != (gate.get("threshold"), gate.get("relative")):
        return None
    failing = []
    for row in table.get("rows", []):
        margin = margin_of(gate, {"baseline": row.get("baseline") or 0.0})
        interval = row.get("margin_interval") or row.get("interval") or [None, None]  # unadjusted: an IUT
        direction = {"interval": interval, "higher_is_better": table.get("higher_is_better"), "tail": row.get("tail")}
        verdict = metric_verdict(direction, margin)
        if row.get("verdict") != verdict:
            return None
        if verdict != "non-inferior":
            failing.append(row["name"])
    if not table.get("rows") or failing != gate.get("slices") or gate.get("value") != len(failing):
        return None
    return not failing


@dataclass(frozen=True)
class Decision:
    """Each gate's re-derived result (None: no rule derives it) and why the report does not pass, if it does not."""

    gates: list[bool | None]
    failures: list[str]

    @property
    def passed(self) -> bool:
        return not self.failures


def decide(report: dict) -> Decision:
    """What the report's numbers support, whatever its `passed` fields say."""
    derived = [derive_gate(gate, report) for gate in report.get("gates", [])]
    failures = [] if derived else ["it applied no gate (expected --min-accuracy, --require or --compare-with)"]
    for gate, result in zip(report.get("gates", []), derived):
        if result is None:
            failures.append(f"gate {gate_words(gate)} cannot be re-derived from the report's numbers")
        elif result != gate.get("passed"):
            failures.append(f"gate {gate_words(gate)} says passed={gate.get('passed')} but its numbers say {result}")
        elif not result and gate.get("kind") in COMPARISON_KINDS and baseline_rows(report) == OVERLAPPING:
            said = ((report.get("evidence") or {}).get("baseline") or {}).get("said")
            failures.append(f"gate {gate_words(gate)} cannot pass: the comparison is biased ({said})")
        elif not result:
            failures.append(gate.get("said") or f"{gate_words(gate)} does not hold (value {gate.get('value')})")
    check = report.get("data_check") or {}
    if check.get("overlaps_training"):
        failures.append(f"the data holds rows version {report.get('version')} trained on ({check.get('note')})")
    return Decision(derived, failures)


def apply(report: dict) -> dict:
    """`report` with each gate's `passed` and the report's `passed` set to what its numbers support, and each
    comparison gate's `basis` (bound, or absence of evidence) to what its kind is."""
    for gate in report["gates"]:
        gate["passed"] = bool(derive_gate(gate, report))
        if basis_of(gate) is not None:
            gate["basis"] = basis_of(gate)
    report["passed"] = decide(report).passed
    return report


def derive_gate(gate: dict, report: dict) -> bool | None:
    """One gate judged again from the report's own numbers."""
    kind = gate.get("kind")
    if kind is None:
        value = (report.get("metrics") or {}).get(gate.get("metric"))
        return value is not None and value == gate.get("value") and holds(gate["op"], value, gate["threshold"])
    comparison = report.get("comparison") or {}
    metrics = comparison.get("metrics") or {}
    if kind not in COMPARISON_KINDS or gate.get("baseline_version") != (comparison.get("baseline") or {}).get(
        "version"
    ):
        return None
    if baseline_rows(report) == OVERLAPPING:
        return False  # the baseline was scored on rows it trained on: flattered, so no comparison can pass
    if kind == "non-inferiority":
        return _non_inferior(gate, metrics.get(gate["metric"]))
    if kind == "slice":
        return _slices_not_worse(gate, comparison)
    if kind == "slice-non-inferiority":
        return _slices_non_inferior(gate, comparison)
    if kind == "change":
        metric = metrics.get(gate["metric"])
        if metric is None:
            return None
        change = change_of(metric["candidate"], metric["baseline"], bool(gate.get("relative")))
        return change == gate.get("value") and holds(gate["op"], change, gate["threshold"])
    primary = metrics.get(comparison.get("primary_metric"))
    p_value = (comparison.get("test") or {}).get("p_value")
    if primary is None or p_value is None or p_value != gate.get("value"):
        return None
    return not significantly_worse(primary, p_value, gate["threshold"])


def baseline_rows(report: dict) -> str | None:
    """What the evidence says of the rows the baseline trained on: disjoint, overlapping, unknown (None: no
    baseline)."""
    baseline = (report.get("evidence") or {}).get("baseline") or {}
    return baseline.get("rows")


def gate_words(gate: dict) -> str:
    """A gate in a few words: `accuracy >= 0.9`, `accuracy not worse vs version 3`."""
    said = f"{gate.get('metric')} {gate.get('op')} {gate.get('threshold')}"
    if gate.get("baseline_version") is not None:
        said += f" vs version {gate['baseline_version']}"
    return said
