"""`trainserve report merge`: the reports of `--shard I/N` clients -> the report one client would have written.

Counts add exactly: examples, requests, retries, confusion matrices (so accuracy and per-class figures are
exact), top-k hits, cross-entropy sums, regression error sums; the labels' mean and spread combine exactly
too, so R2 is exact. Three figures come from histograms each shard carries and are exact only up to the
bin: latency percentiles (bucket upper edges, at most 2 % above the nearest-rank value), and the ROC AUC
and average precision of two classes (scores binned by 1/1000). The merged report says so under "merged".
"""

from __future__ import annotations

import copy
from collections import Counter

import numpy as np

from trainserve.errors import TrainserveError
from trainserve.evaluation.gates import Gate
from trainserve.evaluation.metrics import (
    SCORE_BINS,
    RegressionMetrics,
    curves_from_histogram,
    per_class,
    percentiles_from_histogram,
)
from trainserve.evidence import decision
from trainserve.evidence.decision import OWN_SPLIT
from trainserve.stats.proportions import single_version_intervals
from trainserve.task import Task

# What must be equal across the shards of one evaluation: the same version, on the same data, checked alike.
SAME = ("schema", "server", "model", "version", "signature", "task", "output", "data_check")
SAME_EVIDENCE = ("kind", "split_examples", "version", "baseline")
SAME_SETTINGS = ("batch_size", "limit")
PRECISION = {
    "latency_ms": "p50/p90/p99 are histogram bucket upper edges: at most 2 % above the exact nearest-rank value",
    "roc_auc": f"from {SCORE_BINS}-bin score histograms: scores within 1/{SCORE_BINS} of each other count as tied",
    "examples_per_s": "all examples over the longest shard's wall time (shards run side by side)",
}


def merge_reports(reports: list[dict], sources: list[str]) -> dict:
    """One report from shard reports (checked to be shards of one evaluation, each present once)."""
    shards = _check_shards(reports, sources)
    merged = copy.deepcopy(reports[0])
    task = Task.from_json(merged["task"])
    merged["data"]["examples"] = sum(r["data"]["examples"] for r in reports)
    merged["settings"]["shard"] = None
    merged["metrics"] = (_classification if task.kind == "classification" else _regression)(reports, task)
    merged["performance"] = _performance(reports)
    if "intervals" in merged:  # each shard's would be its own: the merged metrics' intervals, over every example
        merged["intervals"] = single_version_intervals(merged["metrics"], merged["data"]["examples"])
    merged["compare_local"] = _compare_local(reports)
    gates = [Gate(g["metric"], g["op"], g["threshold"]) for g in merged["gates"]]
    merged["gates"] = [gate.judge(merged["metrics"]) for gate in gates]
    merged["evidence"] = _evidence(reports)
    merged["merged"] = {"shards": shards, "reports": sources, "precision": PRECISION}
    return decision.apply(merged)  # the data check counts as in each shard: a refused shard refuses the whole


def _check_shards(reports: list[dict], sources: list[str]) -> list[str]:
    first, where = reports[0], sources[0]
    for report, source in zip(reports[1:], sources[1:]):
        for key in SAME:
            if report.get(key) != first.get(key):
                raise TrainserveError(
                    f"{source} has {key} {report.get(key)!r} but {where} has {first.get(key)!r}: expected shards "
                    "of one evaluation"
                )
        for key in SAME_SETTINGS:
            if report["settings"].get(key) != first["settings"].get(key):
                raise TrainserveError(
                    f"{source} was run with {key} {report['settings'].get(key)}: expected {key} "
                    f"{first['settings'].get(key)} as {where}"
                )
    for report, source in zip(reports[1:], sources[1:]):
        for key in SAME_EVIDENCE:
            if _evidence_of(report).get(key) != _evidence_of(first).get(key):
                raise TrainserveError(
                    f"{source} has evidence {key} {_evidence_of(report).get(key)!r} but {where} has "
                    f"{_evidence_of(first).get(key)!r}: expected shards of one evaluation"
                )
    shards = [r["settings"].get("shard") for r in reports]
    if None in shards:
        raise TrainserveError(f"{sources[shards.index(None)]} is not a shard report: expected reports of --shard I/N")
    counts = {int(s.split("/")[1]) for s in shards}
    expected = {f"{i}/{n}" for n in counts for i in range(n)}
    if len(counts) != 1 or sorted(shards) != sorted(expected):
        missing = sorted(expected - set(shards))
        repeated = sorted(s for s, c in Counter(shards).items() if c > 1)
        raise TrainserveError(
            f"shards {', '.join(sorted(shards))}: expected each of {', '.join(sorted(expected))} once"
            + (f" (missing {', '.join(missing)})" if missing else "")
            + (f" (repeated {', '.join(repeated)})" if repeated else "")
        )
    return sorted(shards, key=lambda s: int(s.split("/")[0]))


def _evidence_of(report: dict) -> dict:
    return report.get("evidence") or {}


def _evidence(reports: list[dict]) -> dict | None:
    """The shards' evidence, whole: partial only if the shards together left examples out (or one had --limit)."""
    if any(r.get("evidence") is None for r in reports):
        return None  # shards from before reports stated their evidence: promote refuses such a report
    merged = copy.deepcopy(reports[0]["evidence"])
    merged["examples"] = sum(r["data"]["examples"] for r in reports)
    whole = merged["split_examples"]
    limited = reports[0]["settings"].get("limit") is not None
    merged["partial"] = limited or whole is None or merged["kind"] != OWN_SPLIT or merged["examples"] < whole
    return merged


def _classification(reports: list[dict], task: Task) -> dict:
    metrics = [r["metrics"] for r in reports]
    if len({m["output_kind"] for m in metrics}) != 1:
        raise TrainserveError("shards disagree on the output kind (probabilities vs logits): expected one model")
    sizes = [r["data"]["examples"] for r in reports]
    n = max(sum(sizes), 1)
    confusion = np.sum([np.asarray(m["confusion_matrix"], np.int64) for m in metrics], axis=0)
    merged = {
        "accuracy": float(np.trace(confusion)) / n,
        "top_k": metrics[0]["top_k"],
        "top_k_accuracy": sum(round(m["top_k_accuracy"] * k) for m, k in zip(metrics, sizes)) / n,
        "loss": sum(m["loss"] * k for m, k in zip(metrics, sizes)) / n,
        "output_kind": metrics[0]["output_kind"],
        "per_class": per_class(confusion, list(task.label_names)),
        "confusion_matrix": confusion.tolist(),
    }
    if "score_histogram" in metrics[0]:
        histogram = {"bins": SCORE_BINS, "negative": Counter(), "positive": Counter()}
        for m in metrics:
            for side in ("negative", "positive"):
                histogram[side].update(m["score_histogram"][side])
        histogram = {**histogram, **{side: dict(histogram[side]) for side in ("negative", "positive")}}
        merged["roc_auc"], merged["average_precision"] = curves_from_histogram(histogram)
        merged["score_histogram"] = histogram
    return merged


def _regression(reports: list[dict], task: Task) -> dict:
    total = RegressionMetrics(task)
    for report in reports:
        n = report["data"]["examples"]
        columns = {
            key: np.array([row[key] for row in report["metrics"]["per_target"]], np.float64)
            for key in ("mse", "mae", "label_mean", "label_sum_sq_dev")
        }
        total.merge(n, columns["mse"] * n, columns["mae"] * n, columns["label_mean"], columns["label_sum_sq_dev"])
    return total.summary()


def _performance(reports: list[dict]) -> dict:
    parts = [r["performance"] for r in reports]
    requests = sum(p["requests"] for p in parts)
    histogram = {
        "floor_ms": parts[0]["latency_histogram"]["floor_ms"],
        "growth": parts[0]["latency_histogram"]["growth"],
    }
    counts = Counter()
    for p in parts:
        counts.update(p["latency_histogram"]["counts"])
    histogram["counts"] = dict(counts)
    p50, p90, p99 = percentiles_from_histogram(histogram)
    wall_s = max(p["wall_s"] for p in parts)
    examples = sum(r["data"]["examples"] for r in reports)
    return {
        "wall_s": wall_s,
        "examples_per_s": examples / wall_s if wall_s > 0 else 0.0,
        "requests": requests,
        "retries": sum(p["retries"] for p in parts),
        "failed_requests": 0,
        "latency_ms": {
            "p50": p50,
            "p90": p90,
            "p99": p99,
            "max": max(p["latency_ms"]["max"] for p in parts),
            "mean": sum(p["latency_ms"]["mean"] * p["requests"] for p in parts) / max(requests, 1),
        },
        "latency_histogram": histogram,
        "client_rss_mb": {k: max(p["client_rss_mb"][k] for p in parts) for k in ("start", "peak")},
    }


def _compare_local(reports: list[dict]) -> dict | None:
    parts = [r["compare_local"] for r in reports]
    if any(p is None for p in parts):
        return None
    sizes = [r["data"]["examples"] for r in reports]
    agreement = None
    if parts[0]["class_agreement"] is not None:
        agreement = sum(p["class_agreement"] * k for p, k in zip(parts, sizes)) / max(sum(sizes), 1)
    return {
        "version_dir": parts[0]["version_dir"],
        "max_abs_diff": max(p["max_abs_diff"] for p in parts),
        "class_agreement": agreement,
    }
