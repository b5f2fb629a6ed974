"""drift.html beside the JSON report: the verdict, the sorted table, and training-vs-traffic plots of the features
that moved most."""

from __future__ import annotations

from pathlib import Path

from trainserve import html_page, plots
from trainserve.files import write_file_atomic

PLOTTED = 6  # per version: the most drifted features


def write_html(report: dict, path: Path) -> Path:
    return write_file_atomic(path, render_html(report).encode())


def render_html(report: dict) -> str:
    if report["drifted"]:
        said = "DRIFT: " + "; ".join(f"v{d['version']} {d['feature']}: {d['said']}" for d in report["drifted"][:8])
    else:
        t = report["thresholds"]
        said = f"NO DRIFT past PSI {t['max_psi']:g} or unseen share {t['max_unseen_share']:.1%}"
    body = [html_page.verdict(report["passed"], said)]
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
            r["js_distance"],
            r["unseen_share"],
            r.get("mean_shift_sd"),
            r["traffic_count"],
            "DRIFT" if r["drifted"] else "",
        ]
        for r in section["features"]
    ]
    table = html_page.table(
        ["feature", "kind", "PSI", "JS distance", "unseen share", "mean shift (training sd)", "traffic values", ""],
        rows,
        caption=f"{section['records']} captured requests, {section['examples']} examples",
        ident=f"drift-v{v}",
    )
    figures = [
        html_page.figure(
            lambda out, r=r: plots.plot_distributions(
                r.get("edges") or [],
                _shares(r["bins"]["training"]),
                _shares(r["bins"]["traffic"]),
                out,
                f"{r['feature']}: PSI {r['psi']:.3f}",
                labels=r["bins"]["labels"] or _edge_labels(r.get("edges") or []),
            ),
            f"v{v} {r['feature']}",
            f"plot-v{v}-{i}",
        )
        for i, r in enumerate(section["features"][:PLOTTED])
    ]
    return f'<h2>Version {v}</h2>{table}<div class="side">{"".join(figures)}</div>'


def _shares(counts: list[int]) -> list[float]:
    total = sum(counts) or 1
    return [c / total for c in counts]


def _edge_labels(edges: list[float]) -> list[str]:
    if not edges:
        return ["all", "missing"]
    return [f"<{edges[0]:.3g}", *(f">={e:.3g}" for e in edges), "missing"]
