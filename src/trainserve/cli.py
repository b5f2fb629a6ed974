"""`trainserve` command line: dispatch to the stages' parsers (each stage's `commands` module builds its
config from flags and calls one function).

Every flag can also be set by an environment variable `TRAINSERVE_<FLAG>` (dashes as underscores),
which is how containers and Kubernetes Jobs configure it; a flag on the command line wins.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys

from trainserve import __version__
from trainserve.errors import TrainserveError
from trainserve.options import EnvDefaults


def build_parser() -> argparse.ArgumentParser:
    from trainserve.drift import commands as drift
    from trainserve.evaluation import commands as evaluation
    from trainserve.live import commands as live
    from trainserve.proxy import commands as capture
    from trainserve.replay import commands as replay
    from trainserve.rollout import commands as rollout
    from trainserve.serving import commands as serving
    from trainserve.training import commands as training

    parser = EnvDefaults(
        prog="trainserve",
        description="Train a Keras model on GPUs, serve it on CPUs with TensorFlow Serving, and prove it works.",
    )
    parser.add_argument("--version", action="version", version=f"trainserve {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=EnvDefaults)
    # the data's path, and the order of --help
    for stage in (training, serving, capture, evaluation, live, replay, drift, rollout):
        stage.add_parsers(commands)
    # stages import no other: what one needs of another is wired here
    commands.choices["live-eval"].set_defaults(roll_back=_roll_back)
    commands.choices["eval"].set_defaults(rollout_in_progress=_rollout_in_progress)
    return parser


def _roll_back(config, model: str, reason: str, routing_file) -> str:
    """`live-eval --on-drop rollback`: `trainserve rollback`'s own step; what moved, in its words."""
    from trainserve.rollout.config import RollbackConfig
    from trainserve.rollout.steps import rollback

    return rollback(RollbackConfig(config=config, model=model, reason=reason, routing_file=routing_file)).describe()


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


def _rollout_in_progress(config, model: str) -> str | None:
    """`eval --skip-during-rollout`: why nothing is evaluated (a rollout of `model` in progress, by the rollout
    stage's history beside `config`), else None."""
    from trainserve.rollout.progress import RolloutInProgress, refuse_during

    try:
        refuse_during(config, model, "eval")
    except RolloutInProgress as exc:
        return str(exc)
    return None


def console() -> int:
    """The `trainserve` program and `python -m trainserve`: `main`, then `leave_quickly` (not in `main`, which
    tests call in their own process)."""
    code = main()
    leave_quickly()
    return code


def leave_quickly() -> None:
    """Collect what is garbage now (its finalizers run: files flushed, writers closed), then freeze what is
    alive: the interpreter's teardown skips frozen objects in its last collection, which with TensorFlow loaded
    walks its millions (0.4 s of a process's exit, 3 s on a busy machine). Objects freed by reference count are
    still freed, and atexit's and logging's flushes still run; only a cycle still alive now is never finalized."""
    gc.collect()
    gc.freeze()
