"""`trainserve train`, `verify`, `runs` and `tf-config`: the training stage's command-line parsers and runners."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainserve.errors import TrainserveError
from trainserve.options import DeprecatedAlias, add_options, config_from_args


def add_parsers(commands) -> None:
    """The training stage's commands."""
    add_train_parser(commands)
    add_verify_parser(commands)
    add_runs_parser(commands)
    add_tf_config_parser(commands)


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
    from trainserve.savedmodel import saved_model_pb
    from trainserve.training.gate import run_gate

    if not args.version_dir.is_dir():
        raise TrainserveError(f"{args.version_dir} is not a directory: expected a SavedModel version directory")
    saved_model_pb(args.version_dir)  # before TensorFlow starts
    result = run_gate(args.version_dir)
    if not result.ok:
        raise TrainserveError(f"{args.version_dir} fails the CPU gate: {result.reason}")
    print(f"{args.version_dir}: OK on CPU ({result.checked}; signatures {', '.join(result.signatures)})")
    return 0


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
    from trainserve.training.run_summaries import fingerprint_warning, read_run, runs_table

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
