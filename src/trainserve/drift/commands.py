"""`trainserve drift`: the drift stage's command-line parser."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainserve.options import add_options, config_from_args


def add_parsers(commands) -> None:
    from trainserve.drift.config import DriftConfig

    p = commands.add_parser(
        "drift",
        help="compare captured inputs with the training data of the version that answered them",
        description="Count captured requests' inputs into the training profile of the version that answered each "
        "(written by trainserve train --data-dir) and report per feature the population stability index, the "
        "Jensen-Shannon distance and the share of categories training never saw, most drifted first. Exit 1 when a "
        "feature passes --max-psi or --max-unseen-share.",
    )
    p.add_argument("captures", nargs="+", type=Path, metavar="CAPTURES", help="capture directories or files")
    add_options(p, DriftConfig)
    p.set_defaults(func=run_drift)


def run_drift(args: argparse.Namespace) -> int:
    from trainserve.drift.config import DriftConfig
    from trainserve.drift.html import write_html
    from trainserve.drift.report import build_report, drift_table, write_report
    from trainserve.drift.run import count_capture

    config = config_from_args(DriftConfig, args)
    versions, read = count_capture(config, args.captures)
    report = build_report(config, args.captures, versions, read)
    print(drift_table(report))
    if config.report is not None:
        print(f"report: {write_report(report, config.report)}")
        print(f"report: {write_html(report, config.report.with_suffix('.html'))}")
    if report["drifted"]:
        said = "; ".join(f"v{d['version']} {d['feature']}: {d['said']}" for d in report["drifted"])
        print(f"trainserve drift: drift past the thresholds: {said}", file=sys.stderr)
        return 1
    return 0
