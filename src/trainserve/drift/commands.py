"""`trainserve drift`: the drift stage's command-line parser."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainserve.options import add_options, config_from_args
from trainserve.shards import add_merge_parser


def add_parsers(commands) -> None:
    from trainserve.drift.config import DriftConfig

    p = commands.add_parser(
        "drift",
        help="compare captured inputs with the training data of the version that answered them",
        description="Count captured requests' inputs into the training profile of the version that answered each "
        "(written by trainserve train --data-dir) and report per feature the population stability index, the "
        "Jensen-Shannon distance and the share of categories training never saw, most drifted first, beside what "
        "sampling noise alone reaches at that many values. Exit 1 when a feature passes --max-psi or "
        "--max-unseen-share plus that noise allowance. Versions without a training profile are named and left out.",
    )
    p.add_argument("captures", nargs="+", type=Path, metavar="CAPTURES", help="capture directories or files")
    add_options(p, DriftConfig)
    p.set_defaults(func=run_drift)
    merge = add_merge_parser(
        commands,
        "drift-merge",
        "drift",
        "Add the shards' traffic counts and compute the effect sizes again against the training profiles: the "
        "report one client would have written. Exit 1 when a feature drifted past the thresholds.",
        run_drift_merge,
    )
    merge.add_argument("--data-dir", type=Path, default=None, help="the training profiles (default: the reports')")


def run_drift(args: argparse.Namespace) -> int:
    from trainserve.drift.config import DriftConfig
    from trainserve.drift.report import build_report
    from trainserve.drift.run import count_capture

    config = config_from_args(DriftConfig, args)
    return _publish(build_report(config, args.captures, count_capture(config, args.captures)), config.report)


def run_drift_merge(args: argparse.Namespace) -> int:
    from trainserve.drift.merge import merge_reports
    from trainserve.drift.report import SCHEMA_PATH
    from trainserve.evidence.document import read_document

    reports = [read_document(path, "drift", SCHEMA_PATH).report for path in args.reports]  # strict, schema-valid
    return _publish(merge_reports(reports, [str(p) for p in args.reports], args.data_dir), args.output)


def _publish(report: dict, path: Path | None) -> int:
    from trainserve.drift.html import write_html
    from trainserve.drift.report import drift_table, unprofiled_lines, write_report
    from trainserve.terminal import say_page

    print(drift_table(report))
    for line in unprofiled_lines(report):
        print(f"trainserve drift: {line}", file=sys.stderr)
    if path is not None:
        print(f"report: {write_report(report, path)}")
        say_page(write_html(report, path.with_suffix(".html")))
    if report["drifted"]:
        said = "; ".join(f"v{d['version']} {d['feature']}: {d['said']}" for d in report["drifted"])
        print(f"trainserve drift: drift past the thresholds: {said}", file=sys.stderr)
        return 1
    return 0
