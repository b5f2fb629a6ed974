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


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: expected an integer >= 1")
    return value


def shape(text: str) -> tuple[int, int, int]:
    try:
        dims = tuple(int(d) for d in text.lower().replace("x", ",").split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected H,W,C such as 28,28,1") from None
    if len(dims) != 3 or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected H,W,C such as 28,28,1")
    return dims  # type: ignore[return-value]


def add_synthetic_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--synthetic-shape", type=shape, default=(28, 28, 1), help="H,W,C of --data synthetic")
    p.add_argument("--synthetic-classes", type=positive_int, default=10, help="classes of --data synthetic")
    p.add_argument("--synthetic-size", type=positive_int, default=10000, help="examples of --data synthetic")


def config_from_args(cls, args: argparse.Namespace):
    """A TrainConfig or EvalConfig from parsed flags: one field per flag, plus the synthetic spec."""
    from trainserve.data import SyntheticSpec

    return cls(
        **{k: getattr(args, k) for k in cls.__dataclass_fields__ if k != "synthetic"},
        synthetic=SyntheticSpec(args.synthetic_shape, args.synthetic_classes, args.synthetic_size),
    )


def add_train_parser(commands) -> None:
    p = commands.add_parser(
        "train",
        help="train a model and publish it as the next numbered SavedModel version",
        description="Train on the visible GPUs (or the CPU), verify the export on a CPU, publish "
        "EXPORT_BASE/MODEL_NAME/<version>/ atomically.",
    )
    p.add_argument("--model-name", default="digits", help="name of the served model (directory under --export-base)")
    p.add_argument("--export-base", type=Path, default=Path("models"), help="model base directory (/models in images)")
    p.add_argument(
        "--data",
        default="digits",
        help="digits (bundled, offline) | synthetic | mnist | fashion_mnist | cifar10 | FILE.npz "
        "with x_train y_train x_test y_test",
    )
    p.add_argument("--data-dir", type=Path, default=Path("data"), help="where the held-out split is shared")
    p.add_argument("--logs-dir", type=Path, default=Path("logs"), help="CSV, TensorBoard, curves PNG, summary")
    p.add_argument("--backup-dir", type=Path, help="resume a killed run from its last finished epoch")
    p.add_argument("--model", dest="architecture", default="cnn", choices=("cnn", "mlp"), help="architecture")
    p.add_argument("--epochs", type=positive_int, default=10, help="epochs to train")
    p.add_argument("--batch-size", type=positive_int, default=64, help="per-replica batch size")
    p.add_argument("--learning-rate", type=float, default=1e-3, help="Adam learning rate")
    p.add_argument("--grad-accum", type=positive_int, default=1, help="accumulate gradients over K steps")
    p.add_argument(
        "--strategy",
        default="auto",
        choices=("auto", "default", "one-device", "mirrored", "multi-worker"),
        help="tf.distribute; auto: multi-worker under TF_CONFIG, mirrored with several GPUs",
    )
    p.add_argument("--cpu-replicas", type=positive_int, default=1, help="split the CPU into N logical devices")
    p.add_argument("--mixed-precision", default="auto", choices=("auto", "on", "off"), help="auto: on for GPUs >= 7.0")
    p.add_argument("--keep", type=positive_int, help="keep only the newest N versions (never the new one)")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    add_synthetic_arguments(p)
    p.set_defaults(func=run_train)


def run_train(args: argparse.Namespace) -> int:
    from trainserve.train import TrainConfig, train

    config = config_from_args(TrainConfig, args)
    result = train(config)
    print(f"published {config.model_name} version {result.version} at {result.version_dir}")
    print(f"held-out accuracy {result.metrics['test_accuracy']:.4f}; run summary {result.summary_path}")
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
    from trainserve.gate import run_gate

    if not args.version_dir.is_dir():
        raise TrainserveError(f"{args.version_dir} is not a directory: expected a SavedModel version directory")
    result = run_gate(args.version_dir)
    if not result.ok:
        raise TrainserveError(f"{args.version_dir} fails the CPU gate: {result.reason}")
    print(f"{args.version_dir}: OK on CPU ({result.checked}; signatures {', '.join(result.signatures)})")
    return 0


def add_serve_local_parser(commands) -> None:
    from trainserve.serving_config import add_serve_local_arguments

    p = commands.add_parser(
        "serve-local",
        help="serve published models over TF Serving's gRPC and REST APIs, without Docker",
        description="An embedded stand-in for tensorflow_model_server: same flag names, version policies, "
        "labels, warmup, status codes and response encoding. SIGTERM finishes in-flight requests, exits 0.",
    )
    add_serve_local_arguments(p)
    p.set_defaults(func=run_serve_local)


def run_serve_local(args: argparse.Namespace) -> int:
    from trainserve.serve_local import serve
    from trainserve.serving_config import options_from_args

    return serve(options_from_args(args))


def add_eval_parser(commands) -> None:
    p = commands.add_parser(
        "eval",
        help="evaluate a served model over gRPC: accuracy, loss, latency, throughput",
        description="Batched gRPC evaluation against TF Serving or serve-local. Exit 1 below --min-accuracy.",
    )
    p.add_argument("--server", default="localhost:8500", help="gRPC HOST:PORT")
    p.add_argument("--model", default="digits", help="model name")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--version", type=positive_int, help="evaluate this version (default: newest)")
    which.add_argument("--label", help="evaluate the version behind this label")
    p.add_argument("--signature", default="serving_default", help="SignatureDef to call")
    p.add_argument("--data", default="digits", help="digits | synthetic | FILE.npz with x_test, y_test")
    p.add_argument("--batch-size", type=positive_int, default=256, help="examples per request")
    p.add_argument("--concurrency", type=positive_int, default=4, help="requests in flight")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per request attempt")
    p.add_argument("--retries", type=int, default=5, help="retries of UNAVAILABLE/DEADLINE_EXCEEDED/RESOURCE_EXHAUSTED")
    p.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the model to be AVAILABLE")
    p.add_argument("--limit", type=positive_int, help="evaluate only the first N examples")
    p.add_argument("--top-k", type=positive_int, default=5, help="k of the top-k accuracy")
    p.add_argument("--report", type=Path, help="write the JSON report here")
    p.add_argument("--plots", type=Path, help="write confusion_matrix.png and latency_histogram.png here")
    p.add_argument("--min-accuracy", type=float, help="exit 1 when accuracy is below this")
    p.add_argument("--tls-ca", type=Path, help="PEM root certificate for a TLS server")
    p.add_argument("--compare-local", type=Path, help="also run this SavedModel version dir in-process on CPU")
    add_synthetic_arguments(p)
    p.set_defaults(func=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    from trainserve.evaluate import EvalConfig, evaluate
    from trainserve.report import summary_table, write_plots, write_report

    config = config_from_args(EvalConfig, args)
    result = evaluate(config)
    print(summary_table(result.report))
    if config.report:
        print(f"report: {write_report(result.report, config.report)}")
    if config.plots:
        for path in write_plots(result.report, result.latencies_ms, config.plots):
            print(f"plot: {path}")
    if not result.passed:
        print(
            f"trainserve eval: accuracy {result.report['metrics']['accuracy']:.4f} is below "
            f"--min-accuracy {config.min_accuracy}",
            file=sys.stderr,
        )
        return 1
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

    from trainserve.cluster import tf_config_from_env

    print(json.dumps(tf_config_from_env()))
    return 0


def build_parser() -> argparse.ArgumentParser:
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
    add_tf_config_parser(commands)
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
        return 2
    except OSError as exc:  # a file or socket the command needed: still one line, not a traceback
        print(f"trainserve {args.command}: error: {exc.strerror or exc}: {exc.filename or ''}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"trainserve {args.command}: interrupted", file=sys.stderr)
        return 130
