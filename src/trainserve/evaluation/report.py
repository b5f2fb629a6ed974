"""The evaluation report: one JSON document (schema in eval_report.schema.json), a one-screen summary,
and PNG plots (confusion matrix, latency histogram)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from trainserve import __version__
from trainserve.layout import write_file_atomic

if TYPE_CHECKING:
    from trainserve.evaluation.run import FinishedRun

SCHEMA_ID = "trainserve.eval/1"
SCHEMA_PATH = Path(__file__).with_name("eval_report.schema.json")


def _percentiles(latencies: list[float]) -> dict:
    ms = np.asarray(latencies, np.float64) * 1000 if latencies else np.zeros(1)
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    return {"p50": p50, "p90": p90, "p99": p99, "max": float(ms.max()), "mean": float(ms.mean())}


def per_class(confusion: np.ndarray, label_names: list[str]) -> list[dict]:
    """Precision, recall and F1 per class from the confusion matrix (rows: truth, columns: predicted)."""
    true_pos = np.diag(confusion).astype(np.float64)
    predicted, actual = confusion.sum(axis=0), confusion.sum(axis=1)
    precision = np.divide(true_pos, predicted, out=np.zeros_like(true_pos), where=predicted > 0)
    recall = np.divide(true_pos, actual, out=np.zeros_like(true_pos), where=actual > 0)
    total = precision + recall
    f1 = np.divide(2 * precision * recall, total, out=np.zeros_like(true_pos), where=total > 0)
    names = label_names or [str(i) for i in range(len(confusion))]
    return [
        {"label": names[i], "precision": precision[i], "recall": recall[i], "f1": f1[i], "support": int(actual[i])}
        for i in range(len(confusion))
    ]


def build_report(run: FinishedRun) -> dict:
    """The report's JSON document (passed: True until the caller applies --min-accuracy)."""
    config, totals = run.config, run.totals
    report = {
        "schema": SCHEMA_ID,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "trainserve": __version__,
        "server": config.server,
        "model": config.model,
        "version": totals.version,
        "label": config.label,
        "signature": config.signature,
        "data": _data_section(run),
        "settings": {
            "batch_size": config.batch_size,
            "concurrency": config.concurrency,
            "timeout_s": config.timeout,
            "retries": config.retries,
            "limit": config.limit,
        },
        "metrics": _metrics_section(run),
        "performance": _performance_section(run),
        "compare_local": None,
        "min_accuracy": config.min_accuracy,
        "passed": True,
    }
    if config.compare_local is not None:
        report["compare_local"] = {
            "version_dir": str(config.compare_local),
            "max_abs_diff": totals.tally.local_max_abs_diff,
            "class_agreement": totals.tally.local_agree / max(totals.tally.examples, 1),
        }
    return json.loads(json.dumps(report, default=float))  # numpy scalars -> plain JSON numbers


def _data_section(run: FinishedRun) -> dict:
    data, classes = run.data, run.plan.num_classes
    return {
        "source": run.config.data,
        "name": data.name,
        "examples": run.totals.tally.examples,
        "input_shape": list(data.shape),
        "classes": classes,
        "label_names": data.label_names or [str(i) for i in range(classes)],
    }


def _metrics_section(run: FinishedRun) -> dict:
    tally = run.totals.tally
    n = max(tally.examples, 1)
    return {
        "accuracy": tally.correct / n,
        "top_k": min(run.config.top_k, run.plan.num_classes),
        "top_k_accuracy": tally.top_k_hits / n,
        "loss": tally.loss_sum / n,
        "per_class": per_class(tally.confusion, run.data.label_names),
        "confusion_matrix": tally.confusion.tolist(),
    }


def _performance_section(run: FinishedRun) -> dict:
    tally, wall_s = run.totals.tally, run.totals.wall_s
    return {
        "wall_s": wall_s,
        "examples_per_s": tally.examples / wall_s if wall_s > 0 else 0.0,
        "requests": tally.requests,
        "retries": tally.retries,
        "failed_requests": 0,  # a request that fails for good ends the run with an error instead
        "latency_ms": _percentiles(tally.latencies),
        "client_rss_mb": {"start": run.start_rss_mb, "peak": run.peak_rss_mb},
    }


def validate_report(report: dict) -> None:
    """Raise jsonschema.ValidationError when the report does not follow the published schema."""
    import jsonschema

    jsonschema.validate(report, json.loads(SCHEMA_PATH.read_text()))


def write_report(report: dict, path: Path) -> Path:
    """Publish the report whole or not at all: a CI job reading it never sees half a file."""
    return write_file_atomic(path, (json.dumps(report, indent=2) + "\n").encode())


def summary_table(report: dict) -> str:
    """One screen: what was evaluated, how well, how fast."""
    m, p = report["metrics"], report["performance"]
    lat = p["latency_ms"]
    lines = [
        f"trainserve eval: model {report['model']!r} version {report['version']} at {report['server']}"
        f" ({report['signature']}, {report['data']['name']})",
        f"  examples        {report['data']['examples']:>10,}    accuracy        {m['accuracy']:>8.4f}",
        f"  top-{m['top_k']} accuracy  {m['top_k_accuracy']:>10.4f}    loss            {m['loss']:>8.4f}",
        f"  examples/s      {p['examples_per_s']:>10,.0f}    wall seconds    {p['wall_s']:>8.2f}",
        f"  latency ms      p50 {lat['p50']:.1f}  p90 {lat['p90']:.1f}  p99 {lat['p99']:.1f}  max {lat['max']:.1f}",
        f"  requests        {p['requests']:>10,}    retries         {p['retries']:>8}",
    ]
    if report["compare_local"]:
        c = report["compare_local"]
        lines.append(
            f"  vs local CPU    max |diff| {c['max_abs_diff']:.2e}  class agreement {c['class_agreement']:.4f}"
        )
    if len(m["per_class"]) <= 20:
        lines.append("  class        precision  recall      f1  support")
        for row in m["per_class"]:
            lines.append(
                f"  {row['label'][:10]:<10} {row['precision']:>10.3f} {row['recall']:>7.3f} {row['f1']:>7.3f}"
                f" {row['support']:>8}"
            )
    if report["min_accuracy"] is not None:
        verdict = "PASS" if report["passed"] else "FAIL"
        lines.append(
            f"  gate            accuracy {m['accuracy']:.4f} vs --min-accuracy {report['min_accuracy']}: {verdict}"
        )
    return "\n".join(lines)


def write_plots(report: dict, latencies_ms: list[float] | None, out_dir: Path) -> list[Path]:
    """confusion_matrix.png and latency_histogram.png in `out_dir`."""
    from trainserve.plots import plot_confusion_matrix, plot_latency_histogram

    out_dir.mkdir(parents=True, exist_ok=True)
    return [
        plot_confusion_matrix(
            np.asarray(report["metrics"]["confusion_matrix"]),
            report["data"]["label_names"],
            out_dir / "confusion_matrix.png",
            f"{report['model']} v{report['version']}: accuracy {report['metrics']['accuracy']:.4f}",
        ),
        plot_latency_histogram(
            latencies_ms or [], report["performance"]["latency_ms"], out_dir / "latency_histogram.png"
        ),
    ]
