"""`trainserve candidate`, `promote` and `rollback`: the rollout stage's command-line parsers and runners."""

from __future__ import annotations

import argparse
import contextlib
import signal
import threading

from trainserve.options import add_options, config_from_args
from trainserve.rollout.report.command import add_report_parser

CANDIDATE = (
    "Add the newest version under the model's base path (or --version) to the config's `specific` versions, wait "
    "until the server has it AVAILABLE, then label it `candidate`. With --routing-file, the model is first routed "
    "with no share (and, with --prometheus, followed by every proxy replica), so that requests naming no version stay "
    "on `stable`. Refused while a rollout of the model is in progress (--skip-during-rollout: a logged no-op instead)."
)
PROMOTE = (
    "Read the eval report of the candidate (trainserve eval --label candidate --report FILE), check it against its "
    "schema and re-derive its decision: its gates from its numbers, its baseline against the config's stable, the "
    "version's files against those it evaluated, its data as the version's own held-out split, evaluated whole; with "
    "--replay, a replay's flip-rate gate from its counts too. Then label the candidate `stable` and keep the old "
    "stable loaded as `previous`, and remove the model's route from --routing-file. A refusal rewrites nothing; "
    "--override CHECK --reason TEXT passes a check, on the record. Refused while a rollout of the model is in "
    "progress (it promotes, or rolls back, itself)."
)
ROLLBACK = (
    "Label the previous stable version (kept loaded since the last promotion) `stable` again; the model's route in "
    "--routing-file is removed unless a `candidate` stays labelled. Refused while a rollout of the model is in "
    "progress (`trainserve rollout --abort --reason TEXT` ends it)."
)
ROLLOUT = (
    "Check the candidate's eval report as promote does, label it `candidate`, then follow --plan (`auto`: steps "
    "sized to the model's request rate, read from Prometheus, said before anything moves; refused when no plan "
    "decides within --max-duration): each step rewrites the proxy's routing file (a shadow share, then canary "
    "shares of `stable` requests) and is judged on Prometheus with anytime-valid bounds: the candidate's error share "
    "and its calls slower than stable's p99 against stable's own, its failed copies against stable's error share, "
    "over the same step, and the flip rate against a budget anchored to the offline disagreement. A failing check "
    "rolls back at once (routing held on stable, confirmed by every proxy replica, then `candidate` dropped); too "
    "few requests or no answer holds, up to the step's hold, then pauses with the routing held on stable (a rerun "
    "resumes the step with its counts); the last step promotes, then --bake keeps previous loaded and judges the "
    "new stable against it, moving stable back to previous on a failure. Every step, query and value lands in the "
    "history, "
    "from which a killed controller resumes, and each end writes a decision report beside it."
)


def add_parsers(commands) -> None:
    """The rollout stage's commands."""
    from trainserve.rollout.config import CandidateConfig, PromoteConfig, RollbackConfig
    from trainserve.rollout.rollout_config import RolloutConfig

    steps = (
        ("candidate", CandidateConfig, run_candidate, "serve the newest published version as `candidate`", CANDIDATE),
        ("promote", PromoteConfig, run_promote, "move `stable` to the candidate whose eval report passed", PROMOTE),
        ("rollback", RollbackConfig, run_rollback, "move `stable` back to the previous stable version", ROLLBACK),
        (
            "rollout",
            RolloutConfig,
            run_rollout,
            "shift live `stable` traffic to a candidate step by step (shadow, canary shares), judged on Prometheus",
            ROLLOUT,
        ),
    )
    for name, options, func, help_text, description in steps:
        p = commands.add_parser(name, help=help_text, description=description)
        add_options(p, options)
        p.set_defaults(func=func)
        if name == "rollout":  # `rollout report HISTORY`: its own parser; `rollout --plan ...` unchanged
            add_report_parser(p.add_subparsers(title="subcommands", dest="rollout_command", metavar="{report}"))


def _rollout_server(config):
    """The server a step waits on (None: no --server, do not wait): the shared TF Serving client."""
    from trainserve.client import ServingClient

    return ServingClient(config.server, tls=config.tls) if config.server else None


def run_candidate(args: argparse.Namespace) -> int:
    from trainserve.rollout.config import CandidateConfig
    from trainserve.rollout.steps import stage_candidate

    config = config_from_args(CandidateConfig, args)
    config.check()
    print(f"candidate: {stage_candidate(config, _rollout_server(config)).describe()}")
    return 0


def run_promote(args: argparse.Namespace) -> int:
    from trainserve.rollout.config import PromoteConfig
    from trainserve.rollout.steps import promote

    config = config_from_args(PromoteConfig, args)
    config.check()
    change = promote(config, _rollout_server(config))
    overridden = change.record["overridden"]
    said = f" OVERRIDING {', '.join(overridden)} (reason: {config.reason})" if overridden else ""
    print(f"promoted{said}: {change.describe()}")
    return 0


def run_rollback(args: argparse.Namespace) -> int:
    from trainserve.rollout.config import RollbackConfig
    from trainserve.rollout.steps import rollback

    config = config_from_args(RollbackConfig, args)
    config.check()
    print(f"rolled back: {rollback(config, _rollout_server(config)).describe()}")
    return 0


def run_rollout(args: argparse.Namespace) -> int:
    from trainserve.rollout.controller import Controller
    from trainserve.rollout.dry_run import dry_run
    from trainserve.rollout.prometheus import Prometheus
    from trainserve.rollout.rollout_config import RolloutConfig

    config = config_from_args(RolloutConfig, args)
    config.check()
    if config.approve:
        from trainserve.rollout.approval import approve

        print(approve(config))
        return 0
    if config.dry_run:
        print("\n".join(["dry run: nothing is changed", *dry_run(config)]))
        return 0
    prometheus = Prometheus(config.prometheus) if config.prometheus else None
    with _terminated_as_interrupted():
        outcome = Controller(config, prometheus, _rollout_server(config)).run()
    print(f"{'promoted' if outcome.promoted else 'rolled back'}: {outcome.said}")
    if outcome.report is not None:
        print(f"decision report: {outcome.report} (open it in a browser: {outcome.report.resolve().as_uri()})")
    return 0 if outcome.promoted else 1


@contextlib.contextmanager
def _terminated_as_interrupted():
    """SIGTERM (a pod deleted, a node drained) ends the controller as SIGINT does, through its failure path: the
    route held on stable before it exits (128 + 15), never a canary share left with nobody watching."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum, frame):
        raise SystemExit(128 + signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
