"""drift.html beside the JSON report: the verdict, the sorted table, and training-vs-traffic plots of the features
that moved most, every plot at one size (two a row) so none is shrunk beside another."""

from __future__ import annotations

from pathlib import Path

from trainserve import html_page, plots
from trainserve.drift.report import non_finite_said, unprofiled_lines, verdict_said
from trainserve.files import write_file_atomic

PLOTTED = 6  # per version: the most drifted features
# A grid of equal columns: a flex row would stretch the last plot of a short row to the page's width. Figures
# without their default 40px margins, so each 700px plot is drawn at three quarters of its size or more.
PLOTS_STYLE = "display:grid;grid-template-columns:repeat(2,minmax(0,1fr));gap:1em"
FIGURE_STYLE = "<style>.plots figure{margin:0}</style>"


def write_html(report: dict, path: Path) -> Path:
    return write_file_atomic(path, render_html(report).encode())


def render_html(report: dict) -> str:
    if report["drifted"]:
        said = "DRIFT: " + "; ".join(f"v{d['version']} {d['feature']}: {d['said']}" for d in report["drifted"][:8])
    else:
        t = report["thresholds"]
        said = (
            f"NO DRIFT past PSI {t['max_psi']:g} or unseen share {t['max_unseen_share']:.1%} "
            "(each plus its sampling-noise allowance)"
        )
    body = [html_page.verdict(report["passed"], said)]
    body += [f'<p class="unprofiled">{html_page.escape(line)}</p>' for line in unprofiled_lines(report)]
    for section in report["versions"]:
        body.append(_section(section))
    footer = f"trainserve {report['trainserve']}, {report['created']}, data profiles from {report['data_dir']}"
    return html_page.page(f"trainserve drift: {report['model']}", body, footer)


def _section(section: dict) -> str:
    v = section["version"]
    rows = [
        [
            r["feature"],
            r["kind"],
            r["psi"],
            (r["noise"] or {}).get("psi"),
            r["js_distance"],
            r["unseen_share"],
            r.get("mean_shift_sd"),
            r["traffic_count"],
            non_finite_said(r),
            verdict_said(r),
        ]
        for r in section["features"]
    ]
    table = html_page.table(
        [
            "feature",
            "kind",
            "PSI",
            "PSI noise (99 %)",
            "JS distance",
            "unseen share",
            "mean shift (training sd)",
            "traffic values",
            "NaN / infinite",
            "",
        ],
        rows,
        caption=f"{section['records']} captured requests, {section['examples']} examples",
        ident=f"drift-v{v}",
    )
    figures = [_figure(v, i, r) for i, r in enumerate(section["features"][:PLOTTED])]
    plots_div = f'<div class="plots" style="{PLOTS_STYLE}">{"".join(figures)}</div>'
    return f"<h2>Version {v}</h2>{table}{FIGURE_STYLE}{plots_div}"


def _figure(version: int, index: int, row: dict) -> str:
    numeric = row["kind"] == "numeric"
    psi = "no values" if row["psi"] is None else f"PSI {row['psi']:.3f}"
    return html_page.figure(
        lambda out: plots.plot_distributions(
            row.get("edges") or [],
            _shares(row["bins"]["training"]),
            _shares(row["bins"]["traffic"]),
            out,
            f"{row['feature']}: {psi}",
            labels=edge_labels(row.get("edges") or []) if numeric else row["bins"]["labels"],
            axis="value (bins between training deciles)" if numeric else "category",
        ),
        f"v{version} {row['feature']}",
        f"plot-v{version}-{index}",
    )


def _shares(counts: list[int]) -> list[float]:
    total = sum(counts) or 1
    return [c / total for c in counts]


def edge_labels(edges: list[float]) -> list[str]:
    """A numeric feature's bins by their values: below the first edge, each [edge, next edge), the last edge up,
    and the missing (NaN) bin."""
    if not edges:
        return ["all", "NaN"]
    inner = [f"{value_label(lo)}-{value_label(hi)}" for lo, hi in zip(edges, edges[1:])]
    return [f"<{value_label(edges[0])}", *inner, f">={value_label(edges[-1])}", "NaN"]


def value_label(value: float) -> str:
    """Three significant digits, thousands as k, M, G: short enough for a range under a bar (11.7k-14.5k)."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"
