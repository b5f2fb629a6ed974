"""`trainserve replay` and `trainserve replay-merge`: the replay stage's command-line parsers."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainserve.options import add_options, config_from_args
from trainserve.shards import add_merge_parser


def add_parsers(commands) -> None:
    from trainserve.replay.config import ReplayConfig

    p = commands.add_parser(
        "replay",
        help="send captured requests to a candidate and to stable; flip rate, shifts, errors, latency",
        description="Replay captured traffic (PredictionLog TFRecords) against two versions of one model, pinned, "
        "each request to both, and compare the answers without labels: the share of examples whose top class flips "
        "(with a one-sided Wilson upper bound), where flips go, probability shifts, regression differences, errors "
        "and both versions' latency. Exit 1 when the flip rate's bound exceeds --max-flip-rate or either version "
        "failed more than --max-error-rate of the requests. Its calls say they are a replay (x-trainserve-origin) "
        "and it reads the capture as it was when it began, so replaying against a capturing server is safe.",
    )
    p.add_argument("captures", nargs="+", type=Path, metavar="CAPTURES", help="capture directories or files")
    add_options(p, ReplayConfig)
    p.set_defaults(func=run_replay)
    add_merge_parser(
        commands,
        "replay-merge",
        "replay",
        "Add the shards' counts and histograms and derive the figures and the gate again: the report one client "
        "would have written. Exit 1 when the merged gate fails.",
        run_replay_merge,
    )


def run_replay(args: argparse.Namespace) -> int:
    from trainserve.replay.config import ReplayConfig
    from trainserve.replay.report import build_report
    from trainserve.replay.run import replay

    config = config_from_args(ReplayConfig, args)
    result = replay(config, args.captures)
    plan = result.plan
    capture = result.capture.as_dict() | {
        "paths": [str(p) for p in args.captures],
        "shard": config.shard.describe() if config.shard else None,
        "other_signature": result.skipped_signature,
    }
    head = {
        "server": config.server,
        "model": config.model,
        "signature": plan.signature,
        "output": plan.output,
        "task": plan.task,
        "class_names": result.class_names,
        "candidate": {"reference": config.judged, "version": plan.versions["candidate"]},
        "baseline": {"reference": config.compare_with, "version": plan.versions["baseline"]},
        "capture": capture,
    }
    settings = {
        "max_flip_rate": config.max_flip_rate,
        "max_error_rate": config.max_error_rate,
        "alpha": config.alpha,
        "limit": config.limit,
    }
    report = build_report(head, result.tally, settings)
    return _publish(report, config.report, "replay")


def _publish(report: dict, path: Path | None, command: str) -> int:
    from trainserve.replay.html import write_html
    from trainserve.replay.report import summary_table, write_report
    from trainserve.terminal import say_page

    print(summary_table(report))
    if path is not None:
        print(f"report: {write_report(report, path)}")
        say_page(write_html(report, path.with_suffix(".html")))
    failed = [g for g in report["gates"] if not g["passed"]]
    if failed:
        print(f"trainserve {command}: gate failed: {'; '.join(g['said'] for g in failed)}", file=sys.stderr)
        return 1
    return 0


def run_replay_merge(args: argparse.Namespace) -> int:
    from trainserve.evidence.document import read_replay_report
    from trainserve.replay.merge import merge_reports

    reports = [read_replay_report(path).report for path in args.reports]  # strict JSON, valid against the schema
    merged = merge_reports(reports, [str(p) for p in args.reports])
    return _publish(merged, args.output, "replay-merge")
