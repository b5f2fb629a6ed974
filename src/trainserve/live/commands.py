"""`trainserve live-eval` and `trainserve live-eval-merge`: the live stage's command-line parsers."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from trainserve.options import add_options, config_from_args
from trainserve.shards import add_merge_parser


def add_parsers(commands) -> None:
    from trainserve.live.config import LiveEvalConfig

    p = commands.add_parser(
        "live-eval",
        help="score captured answers against labels that arrived later: live accuracy per version and window",
        description="Join a labels file to the captured answers by request id (the client's x-request-id) and row, "
        "and score the answers each version really gave: accuracy with intervals per version, per time window and "
        "per slice, the counts joined, unlabelled, labelled but not captured, and duplicates. No request is sent. "
        "With --model-base-path, a label-free estimate of each window's accuracy from the model's calibrated "
        "confidence. Exit 1 when a gate fails (--min-accuracy, --max-drop).",
    )
    p.add_argument("captures", nargs="+", type=Path, metavar="CAPTURES", help="capture directories or files")
    add_options(p, LiveEvalConfig)
    p.set_defaults(func=run_live_eval)
    add_merge_parser(
        commands,
        "live-eval-merge",
        "live-eval",
        "Add the shards' counts (each shard holds whole requests, every version's answers and labels of them) and "
        "compute the intervals, estimates and gates again: the report one client would have written. Exit 1 when "
        "a gate fails.",
        run_live_eval_merge,
    )


def run_live_eval(args: argparse.Namespace) -> int:
    from trainserve.live.config import LiveEvalConfig
    from trainserve.live.join import join_capture
    from trainserve.live.report import build_report

    config = config_from_args(LiveEvalConfig, args)
    joined = join_capture(config, args.captures)
    report = build_report(config, args.captures, joined)
    if config.watch.state is not None:
        from trainserve.live.watch import watch

        report["watch"] = watch(config, joined, time.time(), getattr(args, "roll_back", None))
        report["passed"] = report["passed"] and report["watch"]["verdict"] != "drop shown"
    return _publish_live(report, config.report)


def run_live_eval_merge(args: argparse.Namespace) -> int:
    from trainserve.evidence.document import read_document
    from trainserve.live.merge import merge_reports
    from trainserve.live.report import SCHEMA_PATH

    reports = [read_document(path, "live-eval", SCHEMA_PATH).report for path in args.reports]
    return _publish_live(merge_reports(reports, [str(p) for p in args.reports]), args.output)


def _publish_live(report: dict, path: Path | None) -> int:
    from trainserve.live.html import write_html
    from trainserve.live.report import live_table, report_warnings, write_report
    from trainserve.terminal import say_page

    print(live_table(report))
    for line in report_warnings(report):
        print(f"trainserve live-eval: {line}", file=sys.stderr)
    if path is not None:
        print(f"report: {write_report(report, path)}")
        say_page(write_html(report, path.with_suffix(".html")))
    failed = [g["said"] for g in report["gates"] if not g["passed"]]
    if report.get("watch"):
        failed += _say_watch(report["watch"])
    if failed:
        print(f"trainserve live-eval: gate failed: {'; '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _say_watch(section: dict) -> list[str]:
    """The watch's lines (stdout; a restart and a rollback on stderr too); its words when it shows a drop."""
    print(f"watch: {section['said']}")
    print(f"watch: {section['rate_said']}")
    run = section["run"]
    print(f"watch: this run counted {run['counted']} labelled example(s) ({run['already_counted']} already counted)")
    for line in filter(None, [section["restarted"], (section["rollback"] or {}).get("said")]):
        print(f"trainserve live-eval: watch: {line}", file=sys.stderr)
    return [f"watch: {section['said']}"] if section["verdict"] == "drop shown" else []
