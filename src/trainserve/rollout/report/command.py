"""`trainserve rollout report HISTORY`: a rollout's decision report rendered again from its history (a sub-verb
of `trainserve rollout`, whose parser adds it; `trainserve rollout --plan ...` is unchanged)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from trainserve.options import add_options, config_from_args, option


@dataclass
class ReportConfig:
    """Render the decision report of a model's last rollout from the rollout history."""

    model: str | None = option(None, "the model whose last rollout is rendered (default: the history's only one)")
    out: Path | None = option(
        None, "the HTML file to write (default: beside the history, where the rollout wrote it)", env=False
    )


def add_report_parser(subcommands) -> None:
    p = subcommands.add_parser(
        "report",
        help="render a rollout's decision report (HTML) again from the rollout history",
        description="Read the rollout history (the config's <config>.history.jsonl, or the config itself) and "
        "write the decision report of the model's last rollout: the verdict in one sentence, the evidence it "
        "started from and the budgets it anchored, each step's checks with their bounds against their budgets at "
        "every look, the counts of each proxy replica, every hold and why, each pause and resume. A rollout "
        "writes the same page beside its history when it is promoted, rolled back or paused.",
    )
    p.add_argument("history", type=Path, metavar="HISTORY", help="the rollout history (or the config beside it)")
    add_options(p, ReportConfig)
    p.set_defaults(func=run_report)


def run_report(args: argparse.Namespace) -> int:
    from trainserve.rollout.config_file import history_path
    from trainserve.rollout.report.write import write_page

    config = config_from_args(ReportConfig, args)
    history = args.history
    if history.suffix != ".jsonl" and history_path(history).is_file():  # the config named: its history
        history = history_path(history)
    path = write_page(history, config.model, config.out)
    print(f"report: {path} (open it in a browser: {path.resolve().as_uri()})")
    return 0
