"""The load report: one JSON document (schema in report.schema.json, id trainserve.load/1), a
one-screen table, and the throughput-vs-p99 plot.

A point reports its last 3 windows (the stable ones, when it is stable): throughput in requests/s and
examples/s, p50/p90/p99 of the answered requests, errors by gRPC code, and the quality of every answer
checked against its labels. The best point is the highest examples/s whose p99 is within the latency
budget, among the stable points if any is stable.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from trainserve.evaluation.load import during_report
from trainserve.evaluation.load.config import LoadConfig
from trainserve.evaluation.load.measure import STABILITY_TOLERANCE, STABILITY_WINDOWS, Point
from trainserve.evaluation.report import report_header
from trainserve.files import write_file_atomic

SCHEMA_ID = "trainserve.load/1"
SCHEMA_PATH = Path(__file__).with_name("report.schema.json")


def point_summary(point: Point) -> dict:
    """One point as the report holds it."""
    windows = point.measured.counted
    duration = sum(w.duration_s for w in windows)
    latencies = np.concatenate([w.latencies_s for w in windows]) * 1000
    errors: dict[str, int] = {}
    for w in point.measured.windows:  # every failure of the point, warm-up windows included
        for code, n in w.errors.items():
            errors[code] = errors.get(code, 0) + n
    answered, sent = len(latencies), sum(w.sent for w in windows)
    latency = None
    if answered:
        p50, p90, p99 = np.percentile(latencies, [50, 90, 99])
        latency = {"p50": p50, "p90": p90, "p99": p99, "avg": latencies.mean(), "max": latencies.max()}
    return {
        "mode": point.mode,
        "concurrency": int(point.value) if point.mode == "concurrency" else None,
        "rate": point.value if point.mode == "rate" else None,
        "batch_size": point.batch_size,
        "stable": point.measured.stable,
        "windows": len(point.measured.windows),
        "window_s": point.window_s,
        "duration_s": duration,
        "requests": answered,
        "sent_rps": sent / duration,
        "throughput_rps": answered / duration,
        "examples_per_s": sum(w.examples for w in windows) / duration,
        "latency_ms": latency,
        "errors": errors,
        "error_count": sum(errors.values()),
        "quality": _quality(point.quality),
        "max_send_lag_ms": None if point.measured.max_send_lag_s is None else point.measured.max_send_lag_s * 1000,
        "unfinished": point.measured.unfinished,
        "window_series": [
            {
                "throughput_rps": w.throughput_rps,
                "avg_ms": w.latency_ms("avg"),
                "p99_ms": w.latency_ms("p99"),
                "errors": sum(w.errors.values()),
            }
            for w in point.measured.windows
        ],
    }


def _quality(quality) -> dict | None:
    """Every answer of the point checked against its labels: accuracy, or the regression errors."""
    if quality is None or quality.examples == 0:
        return None
    summary = quality.summary()
    keys = ("accuracy", "loss") if "accuracy" in summary else ("mse", "mae", "r2")
    return {"checked_examples": quality.examples, **{k: summary[k] for k in keys}}


def best_point(points: list[dict], budget_ms: float | None) -> int | None:
    """Index of the highest examples/s whose p99 is within the budget (stable points first), or None."""
    fits = [
        i
        for i, p in enumerate(points)
        if p["latency_ms"] and (budget_ms is None or p["latency_ms"]["p99"] <= budget_ms)
    ]
    stable = [i for i in fits if points[i]["stable"]]
    candidates = stable or fits
    return max(candidates, key=lambda i: points[i]["examples_per_s"]) if candidates else None


def build_load_report(config: LoadConfig, version: int, data_name: str, points: list[Point]) -> dict:
    summaries = [point_summary(p) for p in points]
    best = best_point(summaries, config.latency_budget_ms)
    report = {
        **report_header(SCHEMA_ID, config, version),
        "inputs": {"source": config.data or "synthetic", "name": data_name, "checked": config.data is not None},
        "settings": {
            "batch_sizes": list(config.batch_sizes),
            "concurrency": list(config.concurrencies),
            "rate": list(config.rates),
            "window_s": config.window_s,
            "max_windows": config.max_windows,
            "stability": {
                "windows": STABILITY_WINDOWS,
                "tolerance": STABILITY_TOLERANCE,
                "latency": config.stability_latency,
            },
            "latency_budget_ms": config.latency_budget_ms,
            "timeout_s": config.timeout,
            "seed": config.seed,
        },
        "points": summaries,
        "best": None if best is None else {"point": best, **_describe(summaries[best])},
    }
    return json.loads(json.dumps(report, default=float))  # numpy scalars -> plain JSON numbers


def _describe(point: dict) -> dict:
    return {k: point[k] for k in ("mode", "concurrency", "rate", "batch_size", "examples_per_s", "stable")} | {
        "p99_ms": point["latency_ms"]["p99"]
    }


def validate_load_report(report: dict) -> None:
    """Raise jsonschema.ValidationError when the report does not follow the published schema."""
    import jsonschema

    if report["schema"] == during_report.SCHEMA_ID:
        return during_report.validate_during_report(report)

    jsonschema.validate(report, json.loads(SCHEMA_PATH.read_text()))


def write_load_report(report: dict, path: Path) -> Path:
    return write_file_atomic(path, (json.dumps(report, indent=2) + "\n").encode())


def _row(p: dict) -> str:
    what = f"C={p['concurrency']}" if p["mode"] == "concurrency" else f"R={p['rate']:g}/s"
    lat = p["latency_ms"] or {}
    ms = "  ".join(f"{lat[k]:8.1f}" if k in lat else f"{'-':>8}" for k in ("p50", "p90", "p99"))
    quality = p["quality"] or {}
    check = f"{quality['accuracy']:.3f}" if "accuracy" in quality else f"{quality['mae']:.3g}" if quality else "-"
    flag = "stable" if p["stable"] else f"UNSTABLE ({p['windows']} windows)"
    return (
        f"{what:<10} b={p['batch_size']:<5} {p['throughput_rps']:9.1f} {p['examples_per_s']:10.1f}  {ms}"
        f"  {p['error_count']:6d}  {check:>6}  {flag}"
    )


def load_table(report: dict) -> str:
    """One screen: every point, then the best one within the budget (--during: before, during and after)."""
    if report["schema"] == during_report.SCHEMA_ID:
        return during_report.during_table(report)
    budget = report["settings"]["latency_budget_ms"]
    lines = [
        f"trainserve load: model {report['model']!r} version {report['version']} at {report['server']}"
        f" ({report['signature']}, {report['inputs']['name']})",
        f"{'point':<10} {'batch':<7} {'req/s':>9} {'ex/s':>10}  {'p50 ms':>8}  {'p90 ms':>8}  {'p99 ms':>8}"
        f"  {'errors':>6}  {'check':>6}  stability",
        *(_row(p) for p in report["points"]),
    ]
    within = "" if budget is None else f" with p99 <= {budget:g} ms"
    best = report["best"]
    if best is None:
        lines.append(f"best: no point{within}")
    else:
        what = f"concurrency {best['concurrency']}" if best["mode"] == "concurrency" else f"rate {best['rate']:g}/s"
        lines.append(
            f"best{within}: {best['examples_per_s']:,.1f} examples/s at batch {best['batch_size']}, {what}, "
            f"p99 {best['p99_ms']:.1f} ms" + ("" if best["stable"] else " (unstable)")
        )
    return "\n".join(lines)


def write_load_plot(report: dict, out_dir: Path) -> Path:
    if report["schema"] == during_report.SCHEMA_ID:
        return during_report.write_during_plot(report, out_dir)
    from trainserve import plots

    out_dir.mkdir(parents=True, exist_ok=True)
    title = f"{report['model']} v{report['version']} ({report['signature']})"
    budget = report["settings"]["latency_budget_ms"]
    return plots.plot_throughput_vs_latency(report["points"], out_dir / "throughput_vs_p99.png", title, budget)
