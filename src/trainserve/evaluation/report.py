"""The evaluation report: one JSON document (schema: trainserve/evidence/eval_report.schema.json), a one-screen summary,
and PNG plots (latency; confusion matrix and, for two classes, the precision-recall curve; predicted vs
true and residuals for regression)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from trainserve import __version__
from trainserve.evaluation.config import ClientOptions
from trainserve.evaluation.metrics import latency_histogram, latency_percentiles, precision_recall_curve
from trainserve.evaluation.records import EvalResult, FinishedRun
from trainserve.evidence import decision
from trainserve.evidence.document import SCHEMA_ID, dumps, strict_json
from trainserve.files import write_file_atomic
from trainserve.stats.proportions import single_version_intervals


def report_header(schema: str, config: ClientOptions, version: int) -> dict:
    """What every client's report says first: its schema, when, which trainserve, and which served version."""
    return {
        "schema": schema,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "trainserve": __version__,
        "server": config.server,
        "model": config.model,
        "version": version,
        "label": config.label,
        "signature": config.signature,
    }


def build_report(run: FinishedRun) -> dict:
    """The report's JSON document; its gates and `passed` are what trainserve.evidence.decision derives from its
    numbers, as promote will derive them again."""
    config, totals, task = run.config, run.totals, run.plan.task
    metrics = totals.tally.quality.summary()
    gates = [gate.judge(metrics) for gate in config.gates] + _comparison_gates(run.comparison, config)
    check = run.data_check.to_json() if run.data_check is not None else None
    report = {
        **report_header(SCHEMA_ID, config, totals.version),
        "task": task.to_json(),
        "output": run.plan.output,
        "data": _data_section(run),
        "settings": {
            "batch_size": config.batch_size,
            "concurrency": config.concurrency,
            "timeout_s": config.timeout,
            "retries": config.retries,
            "limit": config.limit,
            "shard": config.shard.describe() if config.shard else None,
        },
        "metrics": metrics,
        "intervals": single_version_intervals(metrics, totals.tally.examples),
        "performance": _performance_section(run),
        "compare_local": None,
        "min_accuracy": config.min_accuracy,
        "gates": gates,
        "passed": False,  # derived below
        "data_matches_version": check["matches"] if check else None,
        "data_check": check,
        "comparison": run.comparison,
        "evidence": run.evidence,
    }
    if config.compare_local is not None:
        agree = totals.tally.local_agree
        report["compare_local"] = {
            "version_dir": str(config.compare_local),
            "max_abs_diff": totals.tally.local_max_abs_diff,
            "class_agreement": None if agree is None else agree / max(totals.tally.examples, 1),
        }
    plain = strict_json(json.loads(json.dumps(report, default=float)))  # numpy scalars -> plain JSON numbers
    return decision.apply(plain)


def _comparison_gates(comparison: dict | None, config) -> list[dict]:
    """--compare-with's gates: not significantly worse (unless --not-worse=false), and the change thresholds;
    none without a baseline (a first rollout), which the report's comparison says."""
    if comparison is None or comparison["baseline"]["version"] is None:
        return []
    from trainserve.evaluation.gates import change_gates, not_worse_gate
    from trainserve.evaluation.noninferiority import margin_gate
    from trainserve.evaluation.slicing import slice_gate, slice_margin_gate

    margins = [margin_gate(m, comparison) for m in config.max_drop or ()]
    significance = [not_worse_gate(comparison, config.alpha)] if config.not_worse and not margins else []
    version = comparison["baseline"]["version"]
    slices = [slice_gate(comparison["slices"], version)] if config.gate_slices else []
    if config.max_drop_per_slice is not None:
        slices.append(slice_margin_gate(comparison["slices"], version))
    return margins + significance + slices + change_gates(config.require_vs_baseline, comparison)


def _data_section(run: FinishedRun) -> dict:
    data, task = run.data, run.plan.task
    inputs = {
        feed.input: {
            "key": feed.key,
            "dtype": _sent_dtype(feed, data.columns[feed.key].dtype),
            "shape": list(data.columns[feed.key].shape),
        }
        for feed in run.plan.feeds
    }
    section = {"source": run.config.data, "name": data.name, "examples": run.totals.tally.examples, "inputs": inputs}
    if len(inputs) == 1:
        section["input_shape"] = next(iter(inputs.values()))["shape"]
    if task.kind == "classification":
        section.update(classes=task.classes, label_names=list(task.label_names))
    if run.plan.unknown_output:
        tally = run.totals.tally
        section["unknown_categories"] = {"values": tally.unknown_cells, "examples": tally.unknown_examples}
    return section


def _sent_dtype(feed, stored: np.dtype) -> str:
    """What the requests carry: the data's dtype, or the signature's for a CSV's text column."""
    dtype = feed.convert if feed.convert is not None else stored
    return "string" if dtype.kind in "OSU" else dtype.name


def _performance_section(run: FinishedRun) -> dict:
    tally, wall_s = run.totals.tally, run.totals.wall_s
    return {
        "wall_s": wall_s,
        "examples_per_s": tally.examples / wall_s if wall_s > 0 else 0.0,
        "requests": tally.requests,
        "retries": tally.retries,
        "failed_requests": 0,  # a request that fails for good ends the run with an error instead
        "latency_ms": latency_percentiles(tally.latencies),
        "latency_histogram": latency_histogram(np.asarray(tally.latencies) * 1000),
        "client_rss_mb": {"start": run.start_rss_mb, "peak": run.peak_rss_mb},
    }


def write_report(report: dict, path: Path) -> Path:
    """Publish the report whole or not at all, strict JSON: a CI job reading it never sees half a file, nor a NaN."""
    return write_file_atomic(path, dumps(report).encode())


def summary_table(report: dict) -> str:
    """One screen: what was evaluated, how well, how fast."""
    m, p = report["metrics"], report["performance"]
    lat = p["latency_ms"]
    lines = [
        f"trainserve eval: model {report['model']!r} version {report['version']} at {report['server']}"
        f" ({report['signature']}, output {report['output']!r}, {report['data']['name']})",
        f"  examples        {report['data']['examples']:>10,}    {report['task']['kind']}",
        *(_classification_lines(m) if report["task"]["kind"] == "classification" else _regression_lines(m)),
        f"  examples/s      {p['examples_per_s']:>10,.0f}    wall seconds    {p['wall_s']:>8.2f}",
        f"  latency ms      p50 {lat['p50']:.1f}  p90 {lat['p90']:.1f}  p99 {lat['p99']:.1f}  max {lat['max']:.1f}",
        f"  requests        {p['requests']:>10,}    retries         {p['retries']:>8}",
    ]
    if "unknown_categories" in report["data"]:
        unknown = report["data"]["unknown_categories"]
        lines.append(
            f"  unseen categories {unknown['values']:>8,}    in examples     {unknown['examples']:>8,}"
            "    (served through the OOV bucket)"
        )
    if report["compare_local"]:
        c = report["compare_local"]
        agreement = "" if c["class_agreement"] is None else f"  class agreement {c['class_agreement']:.4f}"
        lines.append(f"  vs local CPU    max |diff| {c['max_abs_diff']:.2e}{agreement}")
    for gate in report["gates"]:
        lines.append(f"  gate            {describe_gate(gate)}: {'PASS' if gate['passed'] else 'FAIL'}")
    if not report["gates"]:
        lines.append("  gate            none (promote refuses this report: --min-accuracy, --require, --compare-with)")
    check = report.get("data_check")
    if check and check["matches"] is not True:
        lines.append(f"  data            {check['note']}")
    if report.get("comparison"):
        from trainserve.evaluation.comparison import comparison_lines

        lines = comparison_lines(report["comparison"]) + lines
    return "\n".join(lines)


def describe_gate(gate: dict) -> str:
    """One gate as a line says it: value gates `accuracy 0.95 >= 0.9`, comparison gates in their own words and
    what their pass rests on (a bound, or absence of evidence)."""
    from trainserve.evaluation.gates import basis_note

    return _gate_words(gate) + basis_note(gate)


def _gate_words(gate: dict) -> str:
    value = "n/a" if gate["value"] is None else f"{gate['value']:.4f}"
    if gate.get("kind") == "significance":
        p, alpha = gate["value"], gate["threshold"]
        return f"not significantly worse than v{gate['baseline_version']} (p={p:.3g}, alpha {alpha:g})"
    if gate.get("kind") == "slice":
        worse = ", ".join(gate["slices"]) or "none"
        return f"no slice significantly worse than v{gate['baseline_version']} ({gate['correction']}): worse on {worse}"
    if gate.get("kind") == "slice-non-inferiority":
        return gate["said"]
    if gate.get("kind") == "non-inferiority":
        from trainserve.evaluation.noninferiority import describe_margin_gate

        return describe_margin_gate(gate)
    if gate.get("kind") == "change":
        unit = "%" if gate["relative"] else ""
        change, threshold = f"{gate['value']:+.4g}{unit}", f"{gate['threshold']:+g}{unit}"
        return f"{gate['metric']} change {change} {gate['op']} {threshold} vs v{gate['baseline_version']}"
    return f"{gate['metric']} {value} {gate['op']} {gate['threshold']:g}"


def _classification_lines(m: dict) -> list[str]:
    lines = [
        f"  accuracy        {m['accuracy']:>10.4f}    top-{m['top_k']} accuracy  {m['top_k_accuracy']:>8.4f}",
        f"  loss            {m['loss']:>10.4f}    output          {m['output_kind']:>8}",
    ]
    if "roc_auc" in m:
        auc, ap = (f"{v:.4f}" if v is not None else "n/a" for v in (m["roc_auc"], m["average_precision"]))
        lines.append(f"  ROC AUC         {auc:>10}    avg precision   {ap:>8}")
    if len(m["per_class"]) <= 20:
        lines.append("  class        precision  recall      f1  support")
        for row in m["per_class"]:
            lines.append(
                f"  {row['label'][:10]:<10} {row['precision']:>10.3f} {row['recall']:>7.3f} {row['f1']:>7.3f}"
                f" {row['support']:>8}"
            )
    return lines


def _regression_lines(m: dict) -> list[str]:
    lines = [
        f"  MSE             {m['mse']:>10.4f}    RMSE            {m['rmse']:>8.4f}",
        f"  MAE             {m['mae']:>10.4f}    R2              {m['r2']:>8.4f}",
    ]
    if 1 < len(m["per_target"]) <= 20:
        lines.append("  target           MSE     RMSE      MAE       R2")
        for row in m["per_target"]:
            lines.append(
                f"  {row['target'][:10]:<10} {row['mse']:>8.4f} {row['rmse']:>8.4f} {row['mae']:>8.4f}"
                f" {row['r2']:>8.4f}"
            )
    return lines


def write_plots(result: EvalResult, out_dir: Path) -> list[Path]:
    """The task's plots and the latency histogram, as PNGs in `out_dir`."""
    from trainserve import plots

    report, quality = result.report, result.tally.quality
    title = f"{report['model']} v{report['version']}"
    out_dir.mkdir(parents=True, exist_ok=True)
    latency = report["performance"]["latency_ms"]
    written = [plots.plot_latency_histogram(result.latencies_ms, latency, out_dir / "latency_histogram.png")]
    m = report["metrics"]
    if report["task"]["kind"] == "regression":
        truth, predicted = quality.plot_inputs()
        title += f": R2 {m['r2']:.4f}, RMSE {m['rmse']:.4f}"
        return written + [
            plots.plot_predicted_vs_true(truth, predicted, out_dir / "predicted_vs_true.png", title),
            plots.plot_residuals(truth, predicted, out_dir / "residuals.png", title),
        ]
    confusion, names = np.asarray(m["confusion_matrix"]), report["data"]["label_names"]
    title += f": accuracy {m['accuracy']:.4f}"
    written.append(plots.plot_confusion_matrix(confusion, names, out_dir / "confusion_matrix.png", title))
    if m.get("average_precision") is not None:
        precision, recall = precision_recall_curve(*quality.binary_curve_inputs())
        auc = "" if m["roc_auc"] is None else f", ROC AUC {m['roc_auc']:.4f}"  # None: one class only
        title = f"{report['model']} v{report['version']}: AP {m['average_precision']:.4f}{auc}"
        written.append(plots.plot_precision_recall(precision, recall, out_dir / "precision_recall.png", title))
    return written
