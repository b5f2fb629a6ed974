"""live-eval.html beside the JSON report: the verdict, the join's counts, the labels file's problems, per version
the realised accuracy over time with its interval drawn and the label-free estimate beside it, and the slices.
A regression model's page shows MSE and MAE with their intervals instead (MSE over time), and no estimate."""

from __future__ import annotations

import datetime
from pathlib import Path

from trainserve import html_page
from trainserve.files import write_file_atomic
from trainserve.live.report import report_warnings, window_label

COUNTS = ("answers", "labelled", "unlabelled", "duplicates")  # each answer is one of the last three


def write_html(report: dict, path: Path) -> Path:
    return write_file_atomic(path, render_html(report).encode())


def render_html(report: dict) -> str:
    failed = [g["said"] for g in report["gates"] if not g["passed"]]
    if failed:
        said = "GATE FAILED: " + "; ".join(failed)
    elif report["gates"]:
        said = "PASSED: " + "; ".join(g["said"] for g in report["gates"])
    else:
        said = "live accuracy (no gate set)"
    body = [html_page.verdict(report["passed"] if report["gates"] else None, said)]
    body.append(_join_table(report))
    body += [f'<p class="labels">{html_page.escape(line)}</p>' for line in report_warnings(report)]
    metric = _headline(report)
    if any(s["windows"] for s in report["versions"]):
        body.append(html_page.figure(lambda out: plot_over_time(report, out), f"{metric} over time", "plot-over-time"))
    for section in report["versions"]:
        if metric == "mse":
            body.append(_error_section(section, report["settings"]["window"]))
        else:
            body.append(_section(section, report["settings"]["window"]))
    footer = (
        f"trainserve {report['trainserve']}, {report['created']}, labels {report['labels']['path']}, "
        f"join on {report['join']['key']}; no request was sent: the answers are the recorded ones"
    )
    return html_page.page(f"trainserve live-eval: {report['model']}", body, footer)


def _join_table(report: dict) -> str:
    j, labels = report["join"], report["labels"]
    rows = [
        ["captured answers joined to a label", j["joined"]],
        ["captured answers without a label", j["unlabelled"]],
        ["duplicate answers (an example answered again by the same version)", j["duplicates"]],
        ["labels without a captured answer", j["labelled_not_captured"]],
        ["labels-file rows", labels["rows"]],
        *([f"labels-file rows skipped: {kind}", n] for kind, n in labels["bad_rows"].items()),
        ["labels-file rows repeating an example", labels["duplicate_rows"]],
        ["examples given conflicting labels (not scored)", labels["conflicting_examples"]],
    ]
    return html_page.table(["the join", "count"], rows, caption=f"join on {j['key']}", ident="join")


def _headline(report: dict) -> str:
    """The metric drawn over time: accuracy, or a regression model's MSE."""
    return "mse" if report["task"]["kind"] == "regression" else "accuracy"


def _interval_of(cell: dict, metric: str) -> list[float] | None:
    return cell["interval"] if metric == "accuracy" else cell[f"{metric}_interval"]


def _error_section(section: dict, window: str) -> str:
    """A regression version: MSE, RMSE and MAE with their intervals, per window and per slice value."""
    v = section["version"]
    header = ["window (UTC)", *COUNTS, "mse", "interval", "rmse", "mae", "interval"]

    def row(name: str, cell: dict) -> list:
        said = [(f"[{e[0]:.4g}, {e[1]:.4g}]" if (e := _interval_of(cell, m)) else None) for m in ("mse", "mae")]
        return [name, *_counts(cell), cell["mse"], said[0], cell["rmse"], cell["mae"], said[1]]

    rows = [row(window_label(w["start"], window), w) for w in section["windows"]] + [row("all", section["overall"])]
    parts = [f"<h2>Version {v}</h2>", f"<p>{html_page.escape(section['estimate_note'] or '')}</p>"]
    parts.append(html_page.table(header, rows, ident=f"live-v{v}"))
    for column, cells in section["slices"].items():
        ident = f"slice-v{v}-{column}"
        parts.append(
            html_page.table([column, *header[1:]], [row(c["value"], c) for c in cells], caption=column, ident=ident)
        )
    return "".join(parts)


def _section(section: dict, window: str) -> str:
    v = section["version"]
    header = [
        "window (UTC)",
        *COUNTS,
        "accuracy",
        "interval",
        "estimate (every answer)",
        "accuracy - estimate (labelled answers)",
        "loss",
    ]
    rows = [_row(window_label(w["start"], window), w) for w in section["windows"]]
    rows.append(_row("all", section["overall"]))
    parts = [f"<h2>Version {v}</h2>"]
    if section["estimate_note"]:
        parts.append(f"<p>{html_page.escape(section['estimate_note'])}</p>")
    cal = section["calibration"]
    if cal:
        flag = f" FLAGGED: {cal['flagged']}" if cal["flagged"] else ""
        parts.append(
            f"<p>Estimate calibrated on {cal['examples']} held-out examples (accuracy {cal['held_out_accuracy']:.4f}, "
            f"expected calibration error {cal['ece']:.4f}).{html_page.escape(flag)}</p>"
        )
    parts.append(html_page.table(header, rows, ident=f"live-v{v}"))
    for column, cells in section["slices"].items():
        slice_rows = [_row(c["value"], c) for c in cells]
        ident = f"slice-v{v}-{column}"
        parts.append(html_page.table([column, *header[1:]], slice_rows, caption=f"per {column}", ident=ident))
    return "".join(parts)


def _row(name: str, cell: dict) -> list:
    est = cell["estimate"]
    interval = None if cell["interval"] is None else f"[{cell['interval'][0]:.4f}, {cell['interval'][1]:.4f}]"
    return [
        name,
        *_counts(cell),
        cell["accuracy"],
        interval,
        _estimate(est),
        None
        if cell["estimate_labelled"] is None or cell["accuracy"] is None
        else f"{cell['accuracy'] - cell['estimate_labelled']['value']:+.4f}",
        cell["loss"],
    ]


def _estimate(est: dict | None) -> str | None:
    if est is None:
        return None
    moved = est["shift"]
    said = f"{est['value']:.4f} ± {est['error']:.4f}"
    if moved["flagged"]:
        said += (
            f" (FLAGGED: confidences moved, PSI {moved['psi']:.2f} > {moved['threshold']:.2f}; "
            f"widened by {moved['moved']:.2f})"
        )
    return said


def _counts(cell: dict) -> list[int]:
    return [cell["captured"], cell["examples"], cell["unlabelled"], cell["duplicates"]]


def plot_over_time(report: dict, out) -> None:
    """Realised accuracy (a regression model's MSE) per window and version (points, interval bars), the estimate
    beside it (dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = _headline(report)
    fig, ax = plt.subplots(figsize=(9, 4))
    for i, section in enumerate(report["versions"]):
        color = f"C{i % 10}"
        windows = section["windows"]
        when = [datetime.datetime.fromtimestamp(w["start"], datetime.UTC) for w in windows]
        scored = [(t, w) for t, w in zip(when, windows) if _interval_of(w, metric) is not None]
        if scored:
            ax.errorbar(
                [t for t, _ in scored],
                [w[metric] for _, w in scored],
                yerr=[
                    [w[metric] - _interval_of(w, metric)[0] for _, w in scored],
                    [_interval_of(w, metric)[1] - w[metric] for _, w in scored],
                ],
                fmt="o-",
                color=color,
                capsize=3,
                label=f"v{section['version']} realised",
            )
        estimated = [(t, w["estimate"]) for t, w in zip(when, windows) if w["estimate"]]
        if estimated:
            ax.plot(
                [t for t, _ in estimated],
                [e["value"] for _, e in estimated],
                "--",
                color=color,
                label=f"v{section['version']} estimate",
            )
            ax.fill_between(
                [t for t, _ in estimated],
                [e["interval"][0] for _, e in estimated],
                [e["interval"][1] for _, e in estimated],
                color=color,
                alpha=0.12,
            )
    ax.set_xlabel("window start (UTC)")
    ax.set_ylabel(metric)
    settings = report["settings"]
    ax.set_title(f"{report['model']}: {metric} per {settings['window']} window ({settings['level']:.0%} intervals)")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="lower left" if metric == "accuracy" else "upper left", fontsize="small")
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(out, dpi=100, format="png")
    plt.close(fig)
