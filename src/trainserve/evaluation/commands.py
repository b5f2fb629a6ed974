"""`trainserve eval`, `trainserve load`, `trainserve report merge`: the evaluation stage's command-line parsers."""

from __future__ import annotations

import argparse
import logging
import sys

from trainserve.options import add_options, config_from_args
from trainserve.shards import add_merge_parser


def add_parsers(commands) -> None:
    """The evaluation stage's commands."""
    add_eval_parser(commands)
    add_load_parser(commands)
    add_report_parser(commands)


def add_eval_parser(commands) -> None:
    from trainserve.evaluation.config import EvalConfig

    p = commands.add_parser(
        "eval",
        help="evaluate a served model over gRPC: the task's metrics, latency, throughput",
        description="Batched gRPC evaluation of any served model (TF Serving or serve-local): inputs matched by "
        "name, classification or regression metrics, latency and throughput. Exit 1 when a gate fails "
        "(--min-accuracy, --require).",
    )
    add_options(p, EvalConfig)
    p.set_defaults(func=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    from trainserve.evaluation.html_report import write_html
    from trainserve.evaluation.report import summary_table, write_plots, write_report
    from trainserve.evaluation.run import EvalConfig, evaluate
    from trainserve.terminal import browser_line

    config = config_from_args(EvalConfig, args)
    if config.skip_during_rollout and config.rollout_config is not None:  # else its check refuses the flag
        busy = args.rollout_in_progress(config.rollout_config, config.model)
        if busy:
            logging.getLogger("trainserve.evaluation").info("nothing evaluated (--skip-during-rollout): %s", busy)
            return 0
    result = evaluate(config)
    print(summary_table(result.report))
    page = None
    if config.report:
        print(f"report: {write_report(result.report, config.report)}")
        page = write_html(result, config.report.with_suffix(".html"))
        print(f"report: {page}")
    if config.plots:
        for path in write_plots(result, config.plots):
            print(f"plot: {path}")
    if page is not None:  # last, after the plots: the one line a person acts on
        print(browser_line(page))
    check = result.report["data_check"]
    if check and check["overlaps_training"]:
        print(f"trainserve eval: gates refused: the data is {check['note']}", file=sys.stderr)
        return 1
    failed = [g for g in result.report["gates"] if not g["passed"]]
    if failed:
        said = "; ".join(
            g.get("said") or f"{g['metric']} {g['value']} is not {g['op']} {g['threshold']:g}" for g in failed
        )
        print(f"trainserve eval: gate failed: {said}", file=sys.stderr)
        return 1
    return 0


def add_report_parser(commands) -> None:
    p = commands.add_parser("report", help="work with eval reports", description="Work with eval reports.")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    add_merge_parser(
        actions,
        "merge",
        "eval",
        "Combine shard reports into the report one client would have written: counts, confusion matrices and "
        "regression sums add exactly; latency percentiles and two-class curves come from histograms, with their "
        "precision stated in the report.",
        run_report_merge,
    )


def run_report_merge(args: argparse.Namespace) -> int:
    from trainserve.evaluation.merge import merge_reports
    from trainserve.evaluation.report import summary_table, write_report
    from trainserve.evidence.document import read_report

    reports = [read_report(path).report for path in args.reports]  # strict JSON, valid against the schema
    merged = merge_reports(reports, [str(p) for p in args.reports])
    print(summary_table(merged))
    print(f"report: {write_report(merged, args.output)}")
    return 0 if merged["passed"] else 1


def add_load_parser(commands) -> None:
    from trainserve.evaluation.load.config import LoadConfig

    p = commands.add_parser(
        "load",
        help="measure a served model's capacity: throughput and p50/p90/p99 over concurrency and request rate",
        description="Sweep concurrency (closed loop) and request rate (open loop, Poisson arrivals, latency from "
        "the scheduled send time) for each batch size; each point is measured in windows until the last 3 agree "
        "within 10 % (else it is reported unstable). Answers are checked against the labels of --data, or the "
        "inputs are synthetic, from the signature. Exit 1 when no point meets --latency-budget-ms.",
    )
    add_options(p, LoadConfig)
    p.set_defaults(func=run_load)


def run_load(args: argparse.Namespace) -> int:
    from trainserve.evaluation.load.report import load_table, write_load_plot, write_load_report
    from trainserve.evaluation.load.sweep import LoadConfig, run_sweep

    config = config_from_args(LoadConfig, args)
    result = run_sweep(config)
    print(load_table(result.report))
    if config.report:
        print(f"report: {write_load_report(result.report, config.report)}")
    if config.plots:
        print(f"plot: {write_load_plot(result.report, config.plots)}")
    return 0 if result.passed else 1
