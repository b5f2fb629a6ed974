"""The report of `trainserve load --during` (schema during_report.schema.json, id trainserve.load-during/1): the
target's throughput and p50/p99 before, during and after COMMAND, a timeline of them in --bucket-s steps, the
version state changes seen, and a plot of the timeline with COMMAND's span marked."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from trainserve.evaluation.load.config import LoadConfig
from trainserve.evaluation.report import report_header

SCHEMA_ID = "trainserve.load-during/1"
SCHEMA_PATH = Path(__file__).with_name("during_report.schema.json")
PHASES = ("before", "during", "after")


def phase_summary(answers: list, start_s: float, end_s: float) -> dict:
    """Answers completed in [start_s, end_s): throughput, p50/p99 of the answered ones, errors by code."""
    inside = [a for a in answers if start_s <= a.t_s < end_s]
    latencies = np.array([a.latency_s for a in inside if a.error is None]) * 1000
    errors: dict[str, int] = {}
    for answer in inside:
        if answer.error is not None:
            errors[answer.error] = errors.get(answer.error, 0) + 1
    duration = max(end_s - start_s, 1e-9)
    latency = None
    if len(latencies):
        p50, p99 = np.percentile(latencies, [50, 99])
        latency = {"p50": p50, "p99": p99, "max": latencies.max()}
    return {
        "start_s": start_s,
        "duration_s": end_s - start_s,
        "requests": len(latencies),
        "throughput_rps": len(latencies) / duration,
        "latency_ms": latency,
        "errors": errors,
    }


def timeline(answers: list, bucket_s: float, end_s: float) -> list[dict]:
    """One point per --bucket-s: answers/s, p50 and p99 (None in a bucket with no answer), errors."""
    buckets = max(1, math.ceil(end_s / bucket_s))
    points = []
    for k in range(buckets):
        summary = phase_summary(answers, k * bucket_s, min((k + 1) * bucket_s, end_s))
        latency = summary["latency_ms"] or {}
        points.append(
            {
                "t_s": k * bucket_s,
                "throughput_rps": summary["throughput_rps"],
                "p50_ms": latency.get("p50"),
                "p99_ms": latency.get("p99"),
                "errors": sum(summary["errors"].values()),
            }
        )
    return points


def build_during_report(config: LoadConfig, version: int, data_name: str, answers, events, phases) -> dict:
    bounds = {"before": (0.0, phases.started_s), "during": (phases.started_s, phases.end_s)}
    bounds["after"] = (phases.end_s, phases.stopped_s)
    summaries = {name: phase_summary(answers, *bounds[name]) for name in PHASES}
    before, during = summaries["before"]["latency_ms"], summaries["during"]["latency_ms"]
    report = {
        **report_header(SCHEMA_ID, config, version),
        "inputs": {"source": config.data or "synthetic", "name": data_name, "checked": False},
        "settings": {
            "mode": "concurrency" if config.concurrency else "rate",
            "concurrency": config.concurrency[0] if config.concurrency else None,
            "rate": config.rate[0] if config.rate else None,
            "batch_size": config.batch_sizes[0],
            "before_s": config.before_s,
            "after_s": config.after_s,
            "settle_timeout_s": config.settle_timeout_s,
            "bucket_s": config.bucket_s,
            "timeout_s": config.timeout,
        },
        "command": {"argv": phases.argv, "exit_code": phases.exit_code, "started_s": phases.started_s},
        "command_exited_s": phases.exited_s,
        "settled": phases.settled,
        "phases": summaries,
        "p99_during_over_before": during["p99"] / before["p99"] if before and during else None,
        "version_events": list(events),
        "timeline": timeline(answers, config.bucket_s, phases.stopped_s),
    }
    return json.loads(json.dumps(report, default=float))  # numpy scalars -> plain JSON numbers


def validate_during_report(report: dict) -> None:
    import jsonschema

    jsonschema.validate(report, json.loads(SCHEMA_PATH.read_text()))


def during_table(report: dict) -> str:
    """Before, during and after, one line each, and the ratio that decides whether rollouts need a window."""
    s = report["settings"]
    load = f"concurrency {s['concurrency']}" if s["mode"] == "concurrency" else f"rate {s['rate']:g}/s"
    lines = [
        f"trainserve load --during: model {report['model']!r} version {report['version']} at {report['server']}"
        f" ({load}, batch {s['batch_size']}) while `{' '.join(report['command']['argv'])}` ran"
        f" (exit {report['command']['exit_code']})",
        f"{'phase':<8} {'seconds':>8} {'req/s':>9}  {'p50 ms':>8}  {'p99 ms':>8}  {'max ms':>8}  errors",
    ]
    for name in PHASES:
        p = report["phases"][name]
        lat = p["latency_ms"] or {}
        ms = "  ".join(f"{lat[k]:8.1f}" if k in lat else f"{'-':>8}" for k in ("p50", "p99", "max"))
        errors = ", ".join(f"{code} {n}" for code, n in sorted(p["errors"].items())) or "0"
        lines.append(f"{name:<8} {p['duration_s']:8.1f} {p['throughput_rps']:9.1f}  {ms}  {errors}")
    ratio = report["p99_during_over_before"]
    changes = ", ".join(f"v{e['version']} {e['state']} at {e['t_s']:.1f} s" for e in report["version_events"])
    lines.append(f"version changes: {changes or 'none seen'}" + ("" if report["settled"] else " (NOT settled)"))
    lines.append("p99 during / before: " + ("-" if ratio is None else f"{ratio:.2f}x"))
    return "\n".join(lines)


def write_during_plot(report: dict, out_dir: Path) -> Path:
    """Throughput and p50/p99 over time; COMMAND's `during` span shaded, each version change a dotted line."""
    from trainserve.plots import _pyplot

    plt = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    points = report["timeline"]
    t = [p["t_s"] for p in points]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    top.plot(t, [p["throughput_rps"] for p in points], color="C0")
    top.set_ylabel("answers/s")
    for key, color in (("p50_ms", "C2"), ("p99_ms", "C3")):
        bottom.plot(t, [p[key] if p[key] is not None else np.nan for p in points], color=color, label=key[:3])
    bottom.set_ylabel("latency (ms)")
    bottom.set_xlabel("seconds since the load began")
    bottom.legend(fontsize=8)
    during = report["phases"]["during"]
    for ax in (top, bottom):
        ax.axvspan(during["start_s"], during["start_s"] + during["duration_s"], color="tab:orange", alpha=0.2)
        for event in report["version_events"]:
            ax.axvline(event["t_s"], color="gray", linestyle=":", linewidth=1)
        ax.grid(alpha=0.3)
    top.set_title(
        f"{report['model']} v{report['version']} while `{' '.join(report['command']['argv'])[:60]}` ran (shaded)"
    )
    fig.tight_layout()
    out = out_dir / "during_timeline.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
