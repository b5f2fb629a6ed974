"""`trainserve proxy` (and `proxy export`): the command-line parsers and runner (no gRPC imported until it runs,
so --help is quick). `trainserve capture`, its name until it also routed, shadowed and counted, is kept as an alias
until the next release (CHANGELOG.md)."""

from __future__ import annotations

import argparse
import logging

from trainserve.options import add_options, config_from_args
from trainserve.traffic.commands import add_export_parser

FORMER_NAME = "capture"

log = logging.getLogger(__name__)


def add_parsers(commands) -> None:
    from trainserve.proxy.config import ProxyConfig

    p = commands.add_parser(
        "proxy",
        aliases=[FORMER_NAME],
        help="pass-through in front of TF Serving: captures, routes, shadows and counts calls by version",
        description="Forward TF Serving's gRPC PredictionService and ModelService (and REST) to --upstream unchanged, "
        "and write --sampling-rate of the Predict calls, with their answers, as PredictionLog TFRecords under "
        "--filename-prefix (the format of TF Serving's warmup requests), for replay, drift and export. With "
        "--routing-file, requests addressed to `stable` are also shadowed to a candidate version and a share of them "
        "answered by it, and every answer is counted by the version that gave it. "
        "`trainserve proxy export` turns a capture into an eval set. "
        f"`trainserve {FORMER_NAME}` is its former name, kept until the next release.",
    )
    add_options(p, ProxyConfig)
    p.set_defaults(func=run_proxy_command)
    add_export_parser(p.add_subparsers(title="subcommands", dest="proxy_command", metavar="{export}"))


def run_proxy_command(args: argparse.Namespace) -> int:
    from trainserve.proxy.config import ProxyConfig
    from trainserve.proxy.server import run_proxy

    if args.command == FORMER_NAME:
        log.warning("`trainserve %s` is now `trainserve proxy`; the old name goes in the next release", FORMER_NAME)
    return run_proxy(config_from_args(ProxyConfig, args))
