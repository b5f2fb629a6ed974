"""`trainserve capture` (and `capture export`): the command-line parsers and runner (no gRPC imported until it
runs, so --help is quick)."""

from __future__ import annotations

import argparse

from trainserve.options import add_options, config_from_args
from trainserve.traffic.commands import add_export_parser


def add_parsers(commands) -> None:
    from trainserve.capture.config import ProxyConfig

    p = commands.add_parser(
        "capture",
        help="pass-through in front of TF Serving that writes sampled Predict calls as PredictionLog records",
        description="Forward TF Serving's gRPC PredictionService and ModelService (and REST) to --upstream unchanged, "
        "and write --sampling-rate of the Predict calls, with their answers, as PredictionLog TFRecords under "
        "--filename-prefix (the format of TF Serving's warmup requests), for replay, drift and export. With "
        "--routing-file, requests addressed to `stable` are also shadowed to a candidate version and a share of them "
        "answered by it, and every answer is counted by the version that gave it. "
        "`trainserve capture export` turns a capture into an eval set.",
    )
    add_options(p, ProxyConfig)
    p.set_defaults(func=run_capture)
    add_export_parser(p.add_subparsers(title="subcommands", dest="capture_command", metavar="{export}"))


def run_capture(args: argparse.Namespace) -> int:
    from trainserve.capture.config import ProxyConfig
    from trainserve.capture.proxy import run_proxy

    return run_proxy(config_from_args(ProxyConfig, args))
