"""Eval and replay reports for the rollout tests that need no server: complete, valid against the published
schemas, and vouching for the files of a version directory on disk, as `trainserve eval --data-dir` and
`trainserve replay` write them."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from trainserve.evaluation.gates import not_worse_gate
from trainserve.evaluation.noninferiority import Margin, margin_gate
from trainserve.evidence import decision
from trainserve.evidence.document import SCHEMA_ID
from trainserve.layout import version_files_sha256
from trainserve.replay.report import build_report
from trainserve.replay.tally import ReplayTally


def eval_report(version_dir: Path, model: str = "m", accuracy: float = 0.95, threshold: float | None = 0.9) -> dict:
    """A passing (or, below `threshold`, failing) report of `version_dir` on its own held-out split."""
    version = int(version_dir.name)
    correct = round(accuracy * 100)
    report = {
        "schema": SCHEMA_ID,
        "created": "2026-11-26T12:00:00Z",
        "trainserve": "test",
        "server": "serve-cpu:8500",
        "model": model,
        "version": version,
        "label": "candidate",
        "signature": "serving_default",
        "task": {"kind": "classification", "classes": 2, "targets": 0, "label_names": ["a", "b"]},
        "output": "probabilities",
        "data": {"source": "held-out", "name": f"held-out split of version {version}", "examples": 100, "inputs": {}},
        "settings": {"batch_size": 32, "concurrency": 1, "timeout_s": 10, "retries": 0, "limit": None, "shard": None},
        "metrics": {
            "accuracy": correct / 100,
            "top_k": 1,
            "top_k_accuracy": correct / 100,
            "loss": 0.3,
            "per_class": [],
            "confusion_matrix": [[correct, 0], [100 - correct, 0]],
            "output_kind": "probabilities",
        },
        "performance": {
            "wall_s": 1.0,
            "examples_per_s": 100.0,
            "requests": 4,
            "retries": 0,
            "failed_requests": 0,
            "latency_ms": {"p50": 1.0, "p90": 1.0, "p99": 1.0, "max": 1.0, "mean": 1.0},
            "client_rss_mb": {"start": 1.0, "peak": 1.0},
        },
        "compare_local": None,
        "min_accuracy": threshold,
        "gates": [],
        "passed": False,
        "data_matches_version": True,
        "data_check": {
            "version_fingerprint": "f" * 64,
            "data_fingerprint": "f" * 64,
            "matches": True,
            "overlaps_training": False,
            "note": "the held-out split it was trained beside",
        },
        "comparison": None,
        "evidence": {
            "kind": "own-split",
            "said": "the held-out split it was trained beside",
            "examples": 100,
            "split_examples": 100,
            "partial": False,
            "version": {"files_sha256": version_files_sha256(version_dir), "created": "2026-11-26T11:00:00Z"},
            "baseline": None,
        },
    }
    if threshold is not None:
        report["gates"] = [
            {"metric": "accuracy", "op": ">=", "threshold": threshold, "value": correct / 100, "passed": False}
        ]
    return decision.apply(report)


def compared_with(
    report: dict, baseline: int | None, p_value: float = 0.4, difference: float = 0.0, gate: str = "non-inferiority"
) -> dict:
    """`report` as eval --compare-with writes it: against `baseline` (None: a first rollout), with its gate: the
    default margin's non-inferiority gate, or (`gate="significance"`) only "not significantly worse"."""
    report = copy.deepcopy(report)
    version = report["version"]
    if baseline is None:
        report["comparison"] = {
            "baseline": {"reference": "stable", "version": None},
            "candidate_version": version,
            "verdict": "no baseline",
            "verdict_line": f"v{version}: nothing to compare with (first rollout)",
        }
        report["evidence"]["baseline"] = {"reference": "stable", "version": None, "rows": None, "said": "first"}
        return decision.apply(report)
    accuracy = report["metrics"]["accuracy"]
    metric = {
        "candidate": accuracy,
        "baseline": accuracy - difference,
        "difference": difference,
        "interval": [difference - 0.01, difference + 0.01],
        "higher_is_better": True,
    }
    report["comparison"] = {
        "baseline": {"reference": "stable", "version": baseline},
        "candidate_version": version,
        "primary_metric": "accuracy",
        "metrics": {"accuracy": metric},
        "test": {"name": "McNemar's exact test", "p_value": p_value, "discordant": _discordant(report)},
        "verdict": "no significant difference",
        "verdict_line": f"v{version} vs v{baseline}: no significant difference (p={p_value})",
        "alpha": 0.05,
    }
    if gate == "significance":
        report["gates"].append(not_worse_gate(report["comparison"], 0.05))
    else:
        report["gates"].append(margin_gate(Margin("accuracy", 0.03), report["comparison"]))
    report["evidence"]["baseline"] = {
        "reference": "stable",
        "version": baseline,
        "rows": "disjoint",
        "said": f"version {baseline} held out these same rows",
    }
    return decision.apply(report)


def write(report: dict, path: Path) -> Path:
    path.write_text(json.dumps(report, indent=2))
    return path


def replay_report(
    version: int, baseline: int, flips: int, examples: int = 2000, max_flip_rate: float | None = 0.02, **settings
) -> dict:
    """`trainserve replay` of model m's `version` against `baseline` on `examples` captured examples of 2 classes,
    `flips` of them moved from class 0 to class 1, built by replay's own report code."""
    tally = ReplayTally(classes=2)
    tally.flips[:] = [[examples // 2 - flips, flips], [0, examples - examples // 2]]
    tally.requests = tally.paired = tally.examples = examples
    head = {
        "server": "serve-cpu:8500",
        "model": "m",
        "signature": "serving_default",
        "output": "probabilities",
        "task": "classification",
        "class_names": ["a", "b"],
        "candidate": {"reference": "candidate", "version": version},
        "baseline": {"reference": "stable", "version": baseline},
        "capture": {
            "paths": ["captures"],
            "files": 1,
            "records": examples,
            "kept": examples,
            "other_models": {},
            "skipped_records": 0,
            "skipped_bytes": 0,
            "damage": [],
            "shard": settings.pop("shard", None),
            "after_start": {"records": 0, "files_grown": 0, "files_new": 0, "files_gone": 0},
        },
    }
    errors = settings.pop("errors", {})  # side -> {status: requests}
    for side, counts in errors.items():
        tally.errors[side].update(counts)
    tally.paired -= max((sum(c.values()) for c in errors.values()), default=0)
    defaults = {"max_flip_rate": max_flip_rate, "max_error_rate": 0.01, "alpha": 0.05, "limit": None}
    return build_report(head, tally, defaults | settings)


def _discordant(report: dict) -> dict:
    """McNemar's table of a comparison of two equally accurate versions that disagree on 2 of 100 examples."""
    right = round(report["metrics"]["accuracy"] * 100)
    return {"both_right": right - 1, "candidate_only": 1, "baseline_only": 1, "both_wrong": max(0, 99 - right)}


def regression_report(version_dir: Path, baseline: int, model: str = "m", mae: float = 0.8) -> dict:
    """A regression version's passing report against `baseline` on its own held-out split: both versions' MAE
    `mae`, non-inferior on it by a 10 % margin (what the rollout's shadow tolerance is scaled by)."""
    report = compared_with(eval_report(version_dir, model, threshold=None), baseline)
    metrics = {"mse": mae**2, "rmse": mae, "mae": mae, "r2": 0.5, "loss": mae**2}
    report["task"] = {"kind": "regression", "classes": 0, "targets": 1, "label_names": []}
    report["output"] = "predictions"
    report["metrics"] = {
        **metrics,
        "per_target": [{"target": "y", **{k: metrics[k] for k in ("mse", "rmse", "mae", "r2")}}],
    }
    report["comparison"]["primary_metric"] = "mae"
    report["comparison"]["metrics"] = {
        "mae": {
            "candidate": mae,
            "baseline": mae,
            "difference": 0.0,
            "interval": [-0.01, 0.01],
            "higher_is_better": False,
        }
    }
    report["comparison"]["baseline_metrics"] = metrics
    report["gates"] = [margin_gate(Margin("mae", 10.0, relative=True), report["comparison"])]
    return decision.apply(report)


def regression_replay_report(version: int, baseline: int, differences, model: str = "m") -> dict:
    """`trainserve replay` of model `model`'s regression `version` against `baseline`: one example a captured request,
    the candidate's answer `differences` away from the baseline's, built by replay's own report code."""
    import numpy as np

    tally = ReplayTally()
    differences = np.asarray(differences, np.float64)
    tally.add_regression(differences, np.zeros(len(differences)))
    tally.requests = tally.paired = len(differences)
    head = {
        "server": "serve-cpu:8500",
        "model": model,
        "signature": "serving_default",
        "output": "predictions",
        "task": "regression",
        "class_names": [],
        "candidate": {"reference": "candidate", "version": version},
        "baseline": {"reference": "stable", "version": baseline},
        "capture": {
            "paths": ["captures"],
            "files": 1,
            "records": len(differences),
            "kept": len(differences),
            "other_models": {},
            "skipped_records": 0,
            "skipped_bytes": 0,
            "damage": [],
            "shard": None,
            "after_start": {"records": 0, "files_grown": 0, "files_new": 0, "files_gone": 0},
        },
    }
    settings = {"max_flip_rate": None, "max_error_rate": 0.01, "alpha": 0.05, "limit": None}
    return build_report(head, tally, settings)
