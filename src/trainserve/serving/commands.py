"""`trainserve serve-local`: the serving stage's command-line parser and runner."""

from __future__ import annotations

import argparse

from trainserve.options import add_options, config_from_args


def add_parsers(commands) -> None:
    """The serving stage's command."""
    add_serve_local_parser(commands)


def add_serve_local_parser(commands) -> None:
    from trainserve.serving.config import ServerOptions

    p = commands.add_parser(
        "serve-local",
        help="serve published models over TF Serving's gRPC and REST APIs, without Docker",
        description="An embedded stand-in for tensorflow_model_server: same flag names, version policies, "
        "labels, warmup, status codes and response encoding. SIGTERM finishes in-flight requests, exits 0.",
    )
    # tensorflow_model_server's flag names; `--flag=value` and `--flag value` both work.
    add_options(p, ServerOptions, word_separator="_")
    p.set_defaults(func=run_serve_local)


def run_serve_local(args: argparse.Namespace) -> int:
    from trainserve.serving.config import ServerOptions
    from trainserve.serving.server import serve

    return serve(config_from_args(ServerOptions, args))
