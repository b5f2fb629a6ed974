"""The replay report: JSON following replay_report.schema.json (`trainserve.replay/2`), a summary for the terminal,
and the gates (trainserve.evidence.flips: the flip rate's bound, each side's error share). The figures are derived
from the tally the report also stores (`tally`), so a merge of shard reports derives them again from the summed
tallies and gets what one client would have."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import numpy as np

from trainserve import __version__
from trainserve.evidence.flips import SIDES, error_gate, error_shares, flip_gate, flip_rate, verdict
from trainserve.files import write_file_atomic
from trainserve.replay.tally import SHIFT_BINS, ReplayTally, histogram_quantile, log_edges

SCHEMA_ID = "trainserve.replay/2"
SCHEMA_PATH = Path(__file__).with_name("replay_report.schema.json")
TOP_FLIPS = 20


def build_report(head: dict, tally: ReplayTally, settings: dict) -> dict:
    """`head`: what the run was (model, versions, capture); `settings`: max_flip_rate, max_error_rate, alpha and
    limit; the rest is derived from `tally`."""
    alpha, state = settings["alpha"], tally.state()
    report = {
        "schema": SCHEMA_ID,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "trainserve": __version__,
        **head,
        "requests": {"replayed": tally.requests, "paired": tally.paired, "examples": tally.examples},
        "errors": {side: dict(sorted(c.items())) for side, c in tally.errors.items()},
        "error_share": error_share(state),
        "latency_ms": {side: latency_summary(tally, side) for side in SIDES},
        "flips": flips(tally, head["class_names"], alpha) if head["task"] == "classification" else None,
        "probability_shift": shift_summary(tally) if head["task"] == "classification" else None,
        "regression_difference": difference_summary(tally) if head["task"] == "regression" else None,
        "settings": settings,
        "tally": state,
    }
    report["gates"] = gates(report, settings)
    report["passed"] = verdict(report["gates"])
    return report


def error_share(state: dict) -> dict:
    """Each side's own error share, from the tally's stored state (the counts the error gate is judged on)."""
    shares = error_shares(state)
    return {
        **{side: shares.share(side) for side in SIDES},
        "refused_by_both": shares.refused_by_both,
        "what": "each side's failed requests, less those both refused as INVALID_ARGUMENT, of the requests replayed",
    }


def latency_summary(tally: ReplayTally, side: str) -> dict:
    counts, edges = tally.latency[side], log_edges()
    spread = tally.latency_spread[side].summary()
    top = spread["max"] or 0.0
    quantiles = {f"p{q}": histogram_quantile(counts, edges, q / 100, top) for q in (50, 90, 99)}
    return {**quantiles, "mean": spread["mean"], "max": top, "requests": int(counts.sum())}


def class_name(names: list[str], index: int) -> str:
    return names[index] if index < len(names) else str(index)


def flips(tally: ReplayTally, names: list[str], alpha: float) -> dict:
    """The flip rate with its one-sided upper bound, and where the flips go (baseline's class -> candidate's)."""
    matrix, rate = tally.flips, flip_rate(tally.flips, alpha)
    pairs = [
        {"from": class_name(names, i), "to": class_name(names, j), "count": int(matrix[i, j])}
        for i, j in zip(*np.nonzero(matrix))
        if i != j
    ]
    pairs.sort(key=lambda p: (-p["count"], p["from"], p["to"]))
    per_class = []
    for k in range(tally.classes):
        baseline_k = int(matrix[k].sum())
        out, into = baseline_k - int(matrix[k, k]), int(matrix[:, k].sum() - matrix[k, k])
        if out or into:
            per_class.append(
                {
                    "class": class_name(names, k),
                    "baseline_count": baseline_k,
                    "flips_out": out,
                    "flips_in": into,
                    "out_rate": out / baseline_k if baseline_k else 0.0,
                }
            )
    per_class.sort(key=lambda c: (-(c["flips_out"] + c["flips_in"]), c["class"]))
    return {
        "count": rate.count,
        "examples": rate.examples,
        "rate": rate.rate,
        "upper_bound": rate.upper_bound,
        "bound": f"one-sided {1 - alpha:.0%} Wilson score",
        "top": pairs[:TOP_FLIPS],
        "per_class": per_class,
    }


def shift_summary(tally: ReplayTally) -> dict:
    edges = np.linspace(0, 1, SHIFT_BINS + 1)
    spread = tally.shift_spread.summary()
    return {
        "what": "max over classes of |p_candidate - p_baseline|, per example",
        "mean": spread["mean"],
        "max": spread["max"] or 0.0,
        **{f"p{q}": histogram_quantile(tally.shift, edges, q / 100, spread["max"] or 0.0) for q in (50, 90, 99)},
        "histogram": {"edges": [0.0, 1.0], "bins": SHIFT_BINS, "counts": tally.shift.tolist()},
    }


def difference_summary(tally: ReplayTally) -> dict:
    spread = tally.difference.summary()
    edges = log_edges()
    top = max(abs(spread["min"] or 0.0), abs(spread["max"] or 0.0))
    quantiles = {f"abs_p{q}": histogram_quantile(tally.abs_difference, edges, q / 100, top) for q in (50, 90, 99)}
    return {
        "what": "candidate - baseline, every example and target",
        "count": tally.difference.count,
        **spread,
        **quantiles,
    }


def gates(report: dict, settings: dict) -> list[dict]:
    """The error gate always; the flip gate with --max-flip-rate on a classification."""
    judged = [error_gate(error_shares(report["tally"]), settings["max_error_rate"])]
    if settings["max_flip_rate"] is not None and report["flips"] is not None:
        rate = flip_rate(report["tally"]["flip_matrix"], settings["alpha"])
        judged.append(flip_gate(rate, settings["max_flip_rate"], report["flips"]["bound"]))
    return judged


def validate_report(report: dict) -> None:
    """Raise jsonschema.ValidationError when a report does not follow replay_report.schema.json."""
    from trainserve.evidence.document import validate_report as validate

    validate(report, SCHEMA_PATH)


def write_report(report: dict, path: Path) -> Path:
    return write_file_atomic(path, (json.dumps(report, indent=2) + "\n").encode())


def summary_table(report: dict) -> str:
    c, b = report["candidate"], report["baseline"]
    lines = [
        f"replay {report['model']}: v{c['version']} ({c['reference']}) vs v{b['version']} ({b['reference']}) on "
        f"{report['requests']['replayed']} captured requests ({report['requests']['examples']} examples compared)"
    ]
    if report["flips"] is not None:
        f = report["flips"]
        lines.append(f"flip rate {f['rate']:.4f} ({f['count']} of {f['examples']}), upper bound {f['upper_bound']:.4f}")
        for pair in f["top"][:5]:
            lines.append(f"  {pair['from']} -> {pair['to']}: {pair['count']}")
        s = report["probability_shift"]
        lines.append(f"probability shift: mean {s['mean']:.4f}, p99 <= {s['p99']:.4f}, max {s['max']:.4f}")
    if report["regression_difference"] is not None:
        d = report["regression_difference"]
        lines.append(f"difference: mean {d['mean']:+.4g}, sd {d['sd']:.4g}, |d| p99 <= {d['abs_p99']:.4g}")
    for side in SIDES:
        lat, err = report["latency_ms"][side], report["errors"][side]
        errors = ", ".join(f"{k} {v}" for k, v in err.items()) or "none"
        lines.append(f"{side}: latency p50 {lat['p50']:.2f} ms p99 {lat['p99']:.2f} ms; errors {errors}")
    capture = report["capture"]
    left = (capture.get("after_start") or {}).get("records", 0)
    if left or capture.get("other_signature"):
        lines.append(
            f"left out: {left} record(s) written after the replay began (its snapshot of the capture), "
            f"{capture.get('other_signature', 0)} of other signatures"
        )
    for gate in report["gates"]:
        lines.append(f"gate {'PASS' if gate['passed'] else 'FAIL'}: {gate['said']}")
    if report["passed"] is None:
        lines.append("no verdict: no flip-rate gate applied (--max-flip-rate; classification only)")
    return "\n".join(lines)
