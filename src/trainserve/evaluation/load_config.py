"""`trainserve load`'s options, declared once: type, default and help. The CLI is derived from them.

Kept free of gRPC and numpy so that `trainserve load --help` and a bad flag answer at once.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from trainserve.errors import TrainserveError
from trainserve.evaluation.config import TaskChoice, parse_input_map
from trainserve.layout import DEFAULT_SIGNATURE, ensure_writable_dir
from trainserve.options import option, positive_int

DEFAULT_CONCURRENCY = (1, 2, 4, 8)  # the sweep when neither --concurrency nor --rate is given
StabilityLatency = Literal["avg", "p99"]


def positive_ints(text: str) -> tuple[int, ...]:
    """`1,2,4` -> (1, 2, 4): a sweep's values, each >= 1."""
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected integers >= 1 separated by commas, e.g. 1,2,4")
    return values


def positive_floats(text: str) -> tuple[float, ...]:
    """`50,100,200` -> (50.0, 100.0, 200.0): request rates, each > 0."""
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        values = ()
    if not values or min(values) <= 0 or any(v != v or v == float("inf") for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: expected numbers > 0 separated by commas, e.g. 50,100,200")
    return values


def parse_fill(text: str) -> dict[str, float]:
    """`steps=200,x=0.5` -> {input: value} for synthetic inputs."""
    pairs = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        try:
            pairs[name.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep or not name.strip():
            raise argparse.ArgumentTypeError(f"{item!r}: expected INPUT=NUMBER, e.g. steps=200")
    return pairs


@dataclass
class LoadConfig:
    """Everything `trainserve load` takes; each field is the flag of the same name."""

    server: str = option("localhost:8500", "gRPC HOST:PORT")
    model: str = option("digits", "model name")
    version: int | None = option(None, "load this version (default: newest)", parse=positive_int)
    label: str | None = option(None, "load the version behind this label")
    signature: str = option(DEFAULT_SIGNATURE, "SignatureDef to call")
    concurrency: tuple[int, ...] | None = option(
        None, "closed loop: C[,C...] workers, each sends, waits for the answer, sends again "
        f"(default: {','.join(map(str, DEFAULT_CONCURRENCY))} when no --rate is given)", parse=positive_ints,
    )  # fmt: skip
    rate: tuple[float, ...] | None = option(
        None, "open loop: R[,R...] requests/s with Poisson arrivals, sent on schedule whatever is outstanding; "
        "latency counts from the scheduled time", parse=positive_floats,
    )  # fmt: skip
    batch_sizes: tuple[int, ...] = option((1, 8, 32), "examples per request, swept", parse=positive_ints)
    window_s: float = option(2.0, "seconds per measurement window")
    max_windows: int = option(10, "windows to try before a point is reported unstable (>= 3)", parse=positive_int)
    stability_latency: StabilityLatency = option(
        "avg", "the latency the stability rule compares (avg: as perf_analyzer does by default)"
    )
    latency_budget_ms: float | None = option(None, "pick the best throughput whose p99 is within this; exit 1 if none")
    data: str | None = option(
        None, "held-out data (digits | synthetic | FILE.npz | FILE.csv, as for eval): answers are checked against "
        "its labels; default: synthetic inputs built from the signature",
    )  # fmt: skip
    limit: int = option(1024, "requests cycle through the first N examples of --data", parse=positive_int)
    label_column: str | None = option(None, "the label's column of a --data FILE.csv")
    input_map: dict[str, str] = option(
        factory=dict, help="KEY=INPUT[,...]: feed data KEY to signature INPUT (default: same names)",
        parse=parse_input_map,
    )  # fmt: skip
    task: TaskChoice = option("auto", "what the labels of --data are")
    output: str | None = option(None, "the output checked against the labels (default: as eval chooses)")
    fill: dict[str, float] = option(
        factory=dict, help="INPUT=NUMBER[,...]: synthetic inputs: fill INPUT with NUMBER (default: random)",
        parse=parse_fill,
    )  # fmt: skip
    seed: int = option(0, "seed of the Poisson arrivals and the synthetic inputs")
    timeout: float = option(10.0, "seconds per request (DEADLINE_EXCEEDED counts as an error)")
    wait: float = option(60.0, "seconds to wait for the model to be AVAILABLE")
    tls_ca: Path | None = option(None, "PEM root certificate for a TLS server")
    report: Path | None = option(None, "write the JSON report here")
    plots: Path | None = option(None, "write the throughput-vs-p99 plot here")

    def check(self) -> None:
        """Every flag judged before the first request."""
        if self.version is not None and self.label:
            raise TrainserveError("--version and --label both given: expected at most one")
        if self.window_s <= 0:
            raise TrainserveError(f"--window-s {self.window_s:g}: expected seconds > 0")
        if self.max_windows < 3:
            raise TrainserveError(f"--max-windows {self.max_windows}: expected >= 3 (stability compares 3 windows)")
        if self.latency_budget_ms is not None and self.latency_budget_ms <= 0:
            raise TrainserveError(f"--latency-budget-ms {self.latency_budget_ms:g}: expected milliseconds > 0")
        if self.timeout <= 0 or self.wait < 0:
            raise TrainserveError("--timeout must be > 0 and --wait >= 0")
        if self.fill and self.data is not None:
            raise TrainserveError("--fill and --data both given: --fill shapes synthetic inputs, used without --data")
        if self.report is not None:
            ensure_writable_dir(self.report.parent, "--report")
        if self.plots is not None:
            ensure_writable_dir(self.plots, "--plots")

    @property
    def concurrencies(self) -> tuple[int, ...]:
        if self.concurrency is None and self.rate is None:
            return DEFAULT_CONCURRENCY
        return self.concurrency or ()

    @property
    def rates(self) -> tuple[float, ...]:
        return self.rate or ()
