"""`trainserve proxy export`: captured traffic's inputs as an `.npz` eval set, keyed by request id (a
subcommand of `trainserve proxy`, whose parser adds it)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_export_parser(subcommands) -> None:
    p = subcommands.add_parser(
        "export",
        help="write captured requests' inputs to an .npz (x_test..., request_id), to label and evaluate later",
        description="Read a capture (PredictionLog TFRecords) and write one model's request inputs as an .npz: "
        "x_test (one input) or x_test/<input>, plus request_id, request_row, version and timestamp_s per example, "
        "so labels gathered later (a CSV keyed by request id) can be joined before `trainserve eval --data`.",
    )
    p.add_argument("captures", nargs="+", type=Path, metavar="CAPTURES", help="capture directories or files")
    p.add_argument("--model", required=True, help="the model whose requests are exported")
    p.add_argument("--to", type=Path, required=True, metavar="FILE.npz", help="the .npz to write")
    p.set_defaults(func=run_export)


def run_export(args: argparse.Namespace) -> int:
    from trainserve.traffic.export import export_capture

    path, examples, summary = export_capture(args.captures, args.model, args.to)
    print(f"{examples} examples of {summary.kept} captured requests of model {args.model!r} written to {path}")
    return 0
