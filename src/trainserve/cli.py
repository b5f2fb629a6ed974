"""`trainserve` command line: thin parsers that build a config and call one function per stage.

Every flag can also be set by an environment variable `TRAINSERVE_<FLAG>` (dashes as underscores),
which is how containers and Kubernetes Jobs configure it; a flag on the command line wins.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from trainserve import __version__
from trainserve.errors import TrainserveError
from trainserve.options import add_options, config_from_args


class EnvDefaults(argparse.ArgumentParser):
    """An ArgumentParser whose defaults come from TRAINSERVE_* environment variables when set.

    The variables are read when this parser parses, so only the invoked command's flags consult
    them: TRAINSERVE_MODEL means eval's --model to `trainserve eval` and does not trouble `train`.
    """

    def error(self, message: str):
        """One line, naming the problem (argparse's default adds the whole usage block)."""
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")

    def add_argument(self, *names, **kwargs):
        action = super().add_argument(*names, **kwargs)
        if action.help and action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
            action.help += " (default: %(default)s)"
        return action

    def parse_known_args(self, args=None, namespace=None):
        for action in self._actions:
            env = f"TRAINSERVE_{action.dest.upper()}"
            if not action.option_strings or env not in os.environ:
                continue
            raw = os.environ[env]
            if isinstance(action, argparse._StoreTrueAction):
                action.default = raw.lower() in ("1", "true", "yes", "on")
                continue
            try:
                action.default = action.type(raw) if action.type else raw
            except (ValueError, argparse.ArgumentTypeError) as exc:
                self.error(f"environment variable {env}={raw!r}: {exc}")
            if action.choices and action.default not in action.choices:
                self.error(f"environment variable {env}={raw!r}: expected one of {', '.join(action.choices)}")
        return super().parse_known_args(args, namespace)


class DeprecatedAlias(argparse.Action):
    """An old flag name that still works for one release, with a warning naming the new one."""

    def __init__(self, *args, new_flag: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.new_flag = new_flag

    def __call__(self, parser, namespace, values, option_string=None):
        print(
            f"{parser.prog}: warning: {option_string} is deprecated and will be removed in the next release: "
            f"use {self.new_flag}",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, values)


def add_train_parser(commands) -> None:
    from trainserve.training.config import ARCHITECTURES, TrainConfig

    p = commands.add_parser(
        "train",
        help="train a model and publish it as the next numbered SavedModel version",
        description="Train on the visible GPUs (or the CPU), verify the export on a CPU, publish "
        "EXPORT_BASE/MODEL_NAME/<version>/ atomically.",
    )
    add_options(p, TrainConfig)
    # `--model` was the old name of --architecture; `eval --model` names the served model.
    p.add_argument(
        "--model",
        dest="architecture",
        choices=ARCHITECTURES,
        default=argparse.SUPPRESS,
        help=argparse.SUPPRESS,
        action=DeprecatedAlias,
        new_flag="--architecture",
    )
    p.set_defaults(func=run_train)


def run_train(args: argparse.Namespace) -> int:
    from trainserve.training.config import TrainConfig
    from trainserve.training.run import train

    config = config_from_args(TrainConfig, args)
    result = train(config)
    if result.version is None:  # a multi-worker run's other workers: worker 0 publishes
        print(f"trained {config.model_name}; worker 0 publishes the version")
    else:
        print(f"published {config.model_name} version {result.version} at {result.version_dir}")
    held_out = ", ".join(f"{k.removeprefix('test_')} {v:.4f}" for k, v in result.metrics.items())
    print(f"held-out {held_out}; run summary {result.summary_path}")
    return 0


def add_verify_parser(commands) -> None:
    p = commands.add_parser(
        "verify",
        help="run the CPU gate on any SavedModel directory",
        description="Load VERSION_DIR the way TF Serving does on a CPU (tag serve, soft placement off), "
        "reject GPU-pinned nodes, and run its warmup requests (or zero inputs).",
    )
    p.add_argument("version_dir", type=Path, help="a SavedModel directory, e.g. models/digits/3")
    p.set_defaults(func=run_verify)


def run_verify(args: argparse.Namespace) -> int:
    from trainserve.training.gate import run_gate

    if not args.version_dir.is_dir():
        raise TrainserveError(f"{args.version_dir} is not a directory: expected a SavedModel version directory")
    result = run_gate(args.version_dir)
    if not result.ok:
        raise TrainserveError(f"{args.version_dir} fails the CPU gate: {result.reason}")
    print(f"{args.version_dir}: OK on CPU ({result.checked}; signatures {', '.join(result.signatures)})")
    return 0


def add_serve_local_parser(commands) -> None:
    from trainserve.serving.config import add_serve_local_arguments

    p = commands.add_parser(
        "serve-local",
        help="serve published models over TF Serving's gRPC and REST APIs, without Docker",
        description="An embedded stand-in for tensorflow_model_server: same flag names, version policies, "
        "labels, warmup, status codes and response encoding. SIGTERM finishes in-flight requests, exits 0.",
    )
    add_serve_local_arguments(p)
    p.set_defaults(func=run_serve_local)


def run_serve_local(args: argparse.Namespace) -> int:
    from trainserve.serving.config import options_from_args
    from trainserve.serving.server import serve

    return serve(options_from_args(args))


def add_runs_parser(commands) -> None:
    p = commands.add_parser(
        "runs",
        help="compare training runs (CPU vs GPU, strategies, precisions) from their run summaries",
        description="One table of the runs' devices, strategies, precisions, replicas, examples/s, epochs, wall "
        "time, held-out metrics and data fingerprints; warns when the fingerprints differ.",
    )
    p.add_argument("logs", nargs="+", type=Path, help="training --logs-dir directories (or run_summary.json files)")
    p.set_defaults(func=run_runs)


def run_runs(args: argparse.Namespace) -> int:
    from trainserve.training.runs import fingerprint_warning, read_run, runs_table

    rows = [read_run(path) for path in args.logs]
    print(runs_table(rows))
    warning = fingerprint_warning(rows)
    if warning:
        print(warning, file=sys.stderr)
    return 0


def add_tf_config_parser(commands) -> None:
    p = commands.add_parser(
        "tf-config",
        help="print TF_CONFIG for this pod of a Kubernetes Indexed Job (multi-worker training)",
        description="Builds TF_CONFIG from JOB_COMPLETION_INDEX, TRAINSERVE_WORKERS, TRAINSERVE_JOB_NAME, "
        "TRAINSERVE_SERVICE and optionally TRAINSERVE_NAMESPACE and TRAINSERVE_WORKER_PORT (default 2222). "
        'Use: export TF_CONFIG="$(trainserve tf-config)"',
    )
    p.set_defaults(func=run_tf_config)


def run_tf_config(args: argparse.Namespace) -> int:
    import json

    from trainserve.training.cluster import tf_config_from_env

    print(json.dumps(tf_config_from_env()))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from trainserve.evaluation.commands import add_eval_parser, add_load_parser, add_report_parser
    from trainserve.rollout.commands import add_rollout_parsers

    parser = EnvDefaults(
        prog="trainserve",
        description="Train a Keras model on GPUs, serve it on CPUs with TensorFlow Serving, and prove it works.",
    )
    parser.add_argument("--version", action="version", version=f"trainserve {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=EnvDefaults)
    add_train_parser(commands)
    add_verify_parser(commands)
    add_serve_local_parser(commands)
    add_eval_parser(commands)
    add_load_parser(commands)
    add_report_parser(commands)
    add_runs_parser(commands)
    add_tf_config_parser(commands)
    add_rollout_parsers(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not args.verbose:  # TF's own INFO lines (restoring parameters, deprecations) are noise here
        logging.getLogger("tensorflow").setLevel(logging.ERROR)
    try:
        return args.func(args)
    except TrainserveError as exc:
        print(f"trainserve {args.command}: error: {exc}", file=sys.stderr)
        return getattr(exc, "exit_code", 2)  # a few errors have their own (multi-worker's WorkerLost: 75)
    except ModuleNotFoundError as exc:  # a part the core install (the TensorFlow-free eval client) leaves out
        if args.verbose:
            raise
        package = (exc.name or "?").split(".")[0]
        print(
            f"trainserve {args.command}: error: needs the Python package {package!r}, which this install lacks: "
            "pip install 'trainserve[train]' (training, --data digits) or 'trainserve[serve]' (serve-local, verify)",
            file=sys.stderr,
        )
        return 2
    except OSError as exc:  # a file or socket the command needed: still one line, not a traceback
        print(f"trainserve {args.command}: error: {exc.strerror or exc}: {exc.filename or ''}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"trainserve {args.command}: interrupted", file=sys.stderr)
        return 130
