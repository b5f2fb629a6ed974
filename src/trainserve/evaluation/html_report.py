"""`report.html` beside the JSON report: what a person reads to decide a rollout, in one self-contained file.

The verdict first, then the gates, the data check, the metrics (both versions side by side with the paired
intervals for a comparison, and the discordant pairs), per-class figures, the confusion matrix and the latency
histogram. Images are inline `data:` URIs and the page references nothing outside itself, so it opens from a
file:// URL, a CI artifact or a mail attachment alike. A small script records each image's decoded size in
the page (`data-natural-width`), which is how a test in a real browser sees that the images decode.
"""

from __future__ import annotations

from pathlib import Path

from trainserve.evaluation.metrics import latency_percentiles
from trainserve.evaluation.records import EvalResult
from trainserve.evaluation.report import describe_gate
from trainserve.evaluation.statistics_html import interval_text, slice_section, what_it_could_see
from trainserve.evidence.decision import OWN_SPLIT
from trainserve.files import write_file_atomic
from trainserve.html_page import escape, figure_of, page, png_uri, table

SCRIPT = """window.addEventListener("load", function () {
  document.querySelectorAll("img").forEach(function (img) {
    img.setAttribute("data-natural-width", img.naturalWidth);
    img.setAttribute("data-natural-height", img.naturalHeight);
  });
  document.body.setAttribute("data-rendered", "true");
});"""


def write_html(result: EvalResult, path: Path) -> Path:
    """Write the page atomically (a CI job publishing it never sees half a file)."""
    return write_file_atomic(path, render_html(result).encode())


def render_html(result: EvalResult) -> str:
    report = result.report
    title = f"{report['model']} v{report['version']}"
    body = [_header(report), _verdict(report), _gates(report), _data(report), _metrics(report)]
    comparison = report.get("comparison") or {}
    if "metrics" in comparison or report.get("intervals"):
        body.append(what_it_could_see(report))
    if comparison.get("slices"):
        body.append(slice_section(comparison["slices"]))
    if "test" in comparison and "discordant" in comparison["test"]:
        body.append(_discordant(comparison))
    if report["task"]["kind"] == "classification":
        body += [_per_class(report), _confusion(result)]
    else:
        body.append(_regression_plots(result))
    body.append(_latency(result))
    footer = f"trainserve {report['trainserve']}, {report['created']}, server {report['server']}"
    return page(f"trainserve eval: {title}", body, footer, SCRIPT)


def _table(header: list[str], rows: list[list], caption: str = "") -> str:
    return table(header, rows, caption, floats=".4f")


def _header(report: dict) -> str:
    """What was judged, before how it went: model, version, server, data and the evidence it is."""
    evidence = report.get("evidence") or {}
    kind = evidence.get("kind", "unstated")
    partial = ", partial" if evidence.get("partial") else ""
    said = (
        f"model <b>{escape(report['model'])}</b> version <b>{report['version']}</b> on "
        f"<code>{escape(report['server'])}</code>, data {escape(report['data']['name'])} "
        f'({report["data"]["examples"]:,} examples), evidence <b id="evidence-kind">{escape(kind)}{partial}</b>'
    )
    return f'<p id="header">{said}</p>'


def _verdict(report: dict) -> str:
    comparison = report.get("comparison")
    gates = report["gates"]
    evidence = report.get("evidence") or {}
    if not gates:
        state, said = "none", "NO GATE: nothing said what good enough is, so promote refuses this report"
    elif report["passed"] and (evidence.get("kind") != OWN_SPLIT or evidence.get("partial")):
        state, said = "none", f"UNVERIFIED: all {len(gates)} gate(s) hold, on {_unproven(evidence)}"
    elif report["passed"]:
        state, said = "pass", f"PASSED: all {len(gates)} gate(s) hold"
    else:
        state, said = "fail", "FAILED: " + "; ".join(describe_gate(g) for g in gates if not g["passed"])
    if report.get("data_check") and report["data_check"]["overlaps_training"]:
        state, said = "fail", "REFUSED: the data holds rows this version trained on"
    lines = [f'<h1 class="{state}" id="verdict">{escape(said)}</h1>']
    if comparison:
        lines.append(f'<p id="comparison-verdict"><b>{escape(comparison["verdict_line"])}</b></p>')
    return "".join(lines)


def _unproven(evidence: dict) -> str:
    """Why passing gates do not prove the version good: what the data was."""
    if evidence.get("kind") != OWN_SPLIT:
        return f"data that is not the version's verified held-out split ({evidence.get('said', 'no evidence stated')})"
    return f"{evidence.get('examples')} of the split's {evidence.get('split_examples')} examples"


def _gates(report: dict) -> str:
    rows = [[describe_gate(g), "PASS" if g["passed"] else "FAIL"] for g in report["gates"]]
    return "<h2>Gates</h2>" + (_table(["gate", "result"], rows) if rows else "<p>none</p>")


def _data(report: dict) -> str:
    data, check = report["data"], report.get("data_check")
    said = f"{escape(data['name'])} ({escape(data['source'])}), {data['examples']:,} examples"
    if check:
        said += f"; {escape(check['note'])}"
    return f'<h2>Data</h2><p id="data">{said}</p>'


def _metrics(report: dict) -> str:
    m, comparison = report["metrics"], report.get("comparison") or {}
    names = [k for k, v in m.items() if isinstance(v, float) and k != "top_k"]
    if "metrics" not in comparison:
        return "<h2>Metrics</h2>" + _table(["metric", f"v{report['version']}"], [[k, m[k]] for k in names])
    v, b = f"v{comparison['candidate_version']}", f"v{comparison['baseline']['version']}"
    rows = []
    for name, c in comparison["metrics"].items():
        better = "higher" if c["higher_is_better"] else "lower"
        rows.append(
            [name, c["candidate"], c["baseline"], f"{c['difference']:+.4f}", interval_text(c["interval"]), better]
        )
    base = comparison["baseline_metrics"]
    rows += [[k, m[k], base.get(k), "", "", ""] for k in names if k not in comparison["metrics"]]
    lat = comparison["latency_ms"]
    rows += [[f"latency {q} ms", lat["candidate"][q], lat["baseline"][q], "", "", "lower"] for q in ("p50", "p99")]
    header = ["metric", v, b, "difference", f"{100 * comparison.get('level', 0.95):g}% CI", "better"]
    return "<h2>Metrics</h2>" + _table(header, rows)


def _discordant(comparison: dict) -> str:
    test, v, b = comparison["test"], comparison["candidate_version"], comparison["baseline"]["version"]
    d = test["discordant"]
    pairs = _table(
        ["", f"v{b} right", f"v{b} wrong"],
        [[f"v{v} right", d["both_right"], d["candidate_only"]], [f"v{v} wrong", d["baseline_only"], d["both_wrong"]]],
        f"{test['name']}: p = {test['p_value']:.4g} on {d['candidate_only'] + d['baseline_only']} discordant pairs",
    )
    rows = [[r["label"], r["candidate_only"], r["baseline_only"]] for r in test["discordant_per_class"]]
    per_class = _table(["class", f"right only in v{v}", f"right only in v{b}"], rows)
    return f"<h2>Discordant pairs</h2>{pairs}{per_class}"


def _per_class(report: dict) -> str:
    comparison = report.get("comparison") or {}
    baseline = {r["label"]: r for r in comparison.get("baseline_metrics", {}).get("per_class", [])}
    header = ["class", "precision", "recall", "F1", "support"] + (
        [f"F1 v{comparison['baseline']['version']}"] if baseline else []
    )
    rows = [
        [r["label"], r["precision"], r["recall"], r["f1"], r["support"]]
        + ([baseline[r["label"]]["f1"]] if r["label"] in baseline else [])
        for r in report["metrics"]["per_class"]
    ]
    return "<h2>Per class</h2>" + _table(header, rows)


def _png(draw, *args) -> str:
    return png_uri(lambda out: draw(*args, out))


def _confusion(result: EvalResult) -> str:
    import numpy as np

    from trainserve import plots

    report = result.report
    names = report["data"]["label_names"]
    sides = [(f"v{report['version']}", report["metrics"]["confusion_matrix"])]
    comparison = report.get("comparison") or {}
    if "baseline_metrics" in comparison:
        sides.append((f"v{comparison['baseline']['version']}", comparison["baseline_metrics"]["confusion_matrix"]))
    figures = [
        figure_of(
            _png(
                lambda c, out, t=f"{name}: true vs predicted": plots.plot_confusion_matrix(c, names, out, t),
                np.asarray(confusion),
            ),
            f"confusion matrix, {name}",
            f"confusion-{name}",
        )
        for name, confusion in sides
    ]
    return f'<h2>Confusion matrix</h2><div class="side">{"".join(figures)}</div>'


def _regression_plots(result: EvalResult) -> str:
    from trainserve import plots

    truth, predicted = result.tally.quality.plot_inputs()
    title = f"v{result.report['version']}"
    scatter = _png(lambda out: plots.plot_predicted_vs_true(truth, predicted, out, title))
    residuals = _png(lambda out: plots.plot_residuals(truth, predicted, out, title))
    figures = figure_of(scatter, "predicted vs true", "predicted-vs-true") + figure_of(
        residuals, "residuals", "residuals"
    )
    return f'<h2>Predictions</h2><div class="side">{figures}</div>'


def _latency(result: EvalResult) -> str:
    from trainserve import plots

    report = result.report
    sides = [(f"v{report['version']}", result.tally)]
    if result.baseline is not None:
        sides.append((f"v{report['comparison']['baseline']['version']}", result.baseline))
    rows, figures = [], []
    for name, tally in sides:
        summary = latency_percentiles(tally.latencies)
        rows.append([name, *(summary[q] for q in ("p50", "p90", "p99", "max", "mean")), len(tally.latencies)])
        ms = [t * 1000 for t in tally.latencies]
        figures.append(
            figure_of(_png(plots.plot_latency_histogram, ms, summary), f"latency, {name}", f"latency-{name}")
        )
    latencies = _table(["version", "p50 ms", "p90 ms", "p99 ms", "max ms", "mean ms", "requests"], rows)
    return f'<h2>Latency per request</h2>{latencies}<div class="side">{"".join(figures)}</div>'
