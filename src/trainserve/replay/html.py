"""replay.html beside the JSON report: the verdict, where the flips go, the shift and latency distributions."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trainserve import html_page, plots
from trainserve.files import write_file_atomic
from trainserve.replay.tally import LOG_BINS, SHIFT_BINS, ReplayTally, log_edges


def write_html(report: dict, path: Path) -> Path:
    return write_file_atomic(path, render_html(report).encode())


def render_html(report: dict) -> str:
    tally = ReplayTally.from_state(report["tally"])
    c, b = report["candidate"], report["baseline"]
    title = f"trainserve replay: {report['model']} v{c['version']} vs v{b['version']}"
    body = [_verdict(report), _capture(report)]
    if report["flips"] is not None:
        body.append(_flips(report, tally))
    if report["regression_difference"] is not None:
        body.append(_difference(report, tally))
    body.append(_latency(report, tally))
    footer = f"trainserve {report['trainserve']}, {report['created']}, server {report['server']}"
    return html_page.page(title, body, footer)


def _verdict(report: dict) -> str:
    said = "; ".join(g["said"] for g in report["gates"])
    if report["passed"] is None:
        return html_page.verdict(None, f"NO VERDICT: no flip-rate gate (--max-flip-rate sets one); {said}")
    return html_page.verdict(report["passed"], ("PASSED: " if report["passed"] else "FAILED: ") + said)


def _capture(report: dict) -> str:
    cap, req = report["capture"], report["requests"]
    rows = [
        ["capture files", cap["files"]],
        ["records read (all models)", cap["records"]],
        [f"records of {report['model']}" + (f" (shard {cap['shard']})" if cap["shard"] else ""), cap["kept"]],
        ["requests replayed / paired", f"{req['replayed']} / {req['paired']}"],
        ["examples compared", req["examples"]],
        ["records skipped (damage)", cap["skipped_records"]],
        ["bytes skipped (truncated tails)", cap["skipped_bytes"]],
        ["records of other signatures (skipped)", cap.get("other_signature", 0)],
        ["records written after the replay began (left out)", cap["after_start"]["records"]],
    ]
    share = report["error_share"]
    errors = [
        [side, f"{share[side]:.4f}", ", ".join(f"{k}: {v}" for k, v in e.items()) or "none"]
        for side, e in report["errors"].items()
    ]
    damage = "".join(f"<li>{html_page.escape(line)}</li>" for line in cap["damage"][:20])
    return (
        "<h2>Traffic</h2>"
        + html_page.table(["", ""], rows, ident="traffic")
        + html_page.table(
            ["side", "error share", "errors"],
            errors,
            caption=f"{share['refused_by_both']} request(s) refused by both as INVALID_ARGUMENT: not counted",
            ident="errors",
        )
        + (f"<ul>{damage}</ul>" if damage else "")
    )


def _flips(report: dict, tally: ReplayTally) -> str:
    f, names = report["flips"], report["class_names"] or [str(k) for k in range(tally.classes)]
    head = html_page.table(
        ["flip rate", "flips", "examples", f["bound"]],
        [[f["rate"], f["count"], f["examples"], f["upper_bound"]]],
        ident="flip-rate",
    )
    pairs = html_page.table(
        ["from (baseline)", "to (candidate)", "count"],
        [[p["from"], p["to"], p["count"]] for p in f["top"]],
        ident="flip-pairs",
    )
    per_class = html_page.table(
        ["class", "baseline's count", "flips out", "flips in", "out rate"],
        [[p["class"], p["baseline_count"], p["flips_out"], p["flips_in"], p["out_rate"]] for p in f["per_class"]],
        ident="flips-per-class",
    )
    if not tally.classes:  # nothing compared (an empty shard): no matrix to draw
        return f"<h2>Flips</h2>{head}"
    matrix = html_page.figure(
        lambda out: plots.plot_confusion_matrix(tally.flips, names, out, "baseline's class (rows) -> candidate's"),
        "top class, baseline -> candidate",
        "flip-matrix",
    )
    shift = html_page.figure(
        lambda out: plots.plot_histogram(
            np.linspace(0, 1, SHIFT_BINS + 1),
            tally.shift,
            out,
            "probability shift",
            "max |p_candidate - p_baseline| per example",
        ),
        "probability shift per example",
        "probability-shift",
    )
    return f'<h2>Flips</h2>{head}{pairs}{per_class}<div class="side">{matrix}{shift}</div>'


def _difference(report: dict, tally: ReplayTally) -> str:
    d = report["regression_difference"]
    table = html_page.table(
        ["count", "mean", "sd", "min", "max", "|d| p50", "|d| p99"],
        [[d["count"], d["mean"], d["sd"], d["min"], d["max"], d["abs_p50"], d["abs_p99"]]],
        ident="difference",
    )
    lo, hi = _occupied(tally.abs_difference)
    fig = html_page.figure(
        lambda out: plots.plot_histogram(
            log_edges()[lo : hi + 1],
            tally.abs_difference[lo:hi],
            out,
            "|candidate - baseline|",
            "absolute difference",
            log_x=True,
        ),
        "regression difference",
        "difference-histogram",
    )
    return f"<h2>Prediction differences</h2>{table}{fig}"


def _occupied(counts: np.ndarray) -> tuple[int, int]:
    nonzero = np.nonzero(counts)[0]
    return (int(nonzero[0]), int(nonzero[-1]) + 1) if nonzero.size else (0, min(1, LOG_BINS))


def _latency(report: dict, tally: ReplayTally) -> str:
    rows = [
        [side, *(report["latency_ms"][side][q] for q in ("p50", "p90", "p99", "max", "mean", "requests"))]
        for side in ("candidate", "baseline")
    ]
    figures = []
    for side in ("candidate", "baseline"):
        lo, hi = _occupied(tally.latency[side])
        figures.append(
            html_page.figure(
                lambda out, s=side, lo=lo, hi=hi: plots.plot_histogram(
                    log_edges()[lo : hi + 1], tally.latency[s][lo:hi], out, f"latency, {s}", "ms", log_x=True
                ),
                f"latency per request, {side}",
                f"latency-{side}",
            )
        )
    table = html_page.table(
        ["version", "p50 ms", "p90 ms", "p99 ms", "max ms", "mean ms", "requests"], rows, ident="latency"
    )
    return f'<h2>Latency on the captured mix</h2>{table}<div class="side">{"".join(figures)}</div>'
