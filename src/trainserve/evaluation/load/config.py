"""`trainserve load`'s options, declared once: type, default and help. The CLI is derived from them.

Kept free of gRPC and numpy so that `trainserve load --help` and a bad flag answer at once.
"""

from __future__ import annotations

import math
import shlex
import shutil
from dataclasses import dataclass
from typing import Literal

from trainserve.errors import TrainserveError
from trainserve.evaluation.config import ClientOptions
from trainserve.options import key_values, number_list, option, parse_bool, positive_int
from trainserve.traffic.origin import LOAD

DEFAULT_CONCURRENCY = (1, 2, 4, 8)  # the sweep when neither --concurrency nor --rate is given
StabilityLatency = Literal["avg", "p99"]


def positive_ints(text: str) -> tuple[int, ...]:
    """`1,2,4` -> (1, 2, 4): a sweep's values, each >= 1."""
    return number_list(text, int, lambda v: v >= 1, "integers >= 1 separated by commas, e.g. 1,2,4")


def positive_floats(text: str) -> tuple[float, ...]:
    """`50,100,200` -> (50.0, 100.0, 200.0): request rates, each > 0 and finite."""
    return number_list(text, float, lambda v: 0 < v < math.inf, "numbers > 0 separated by commas, e.g. 50,100,200")


def parse_fill(text: str) -> dict[str, float]:
    """`steps=200,x=0.5` -> {input: value} for synthetic inputs."""
    return key_values(text, float, "INPUT=NUMBER, e.g. steps=200")


@dataclass
class LoadConfig(ClientOptions):
    """Everything `trainserve load` takes; each field is the flag of the same name."""

    concurrency: tuple[int, ...] | None = option(
        None,
        "closed loop: C[,C...] workers, each sends, waits for the answer, sends again "
        f"(default: {','.join(map(str, DEFAULT_CONCURRENCY))} when no --rate is given)",
        parse=positive_ints,
    )
    rate: tuple[float, ...] | None = option(
        None,
        "open loop: R[,R...] requests/s with Poisson arrivals, sent on schedule whatever is outstanding; "
        "latency counts from the scheduled time",
        parse=positive_floats,
    )
    batch_sizes: tuple[int, ...] = option((1, 8, 32), "examples per request, swept", parse=positive_ints)
    window_s: float = option(2.0, "seconds per measurement window")
    max_windows: int = option(10, "windows to try before a point is reported unstable (>= 3)", parse=positive_int)
    stability_latency: StabilityLatency = option(
        "avg", "the latency the stability rule compares (avg: as perf_analyzer does by default)"
    )
    latency_budget_ms: float | None = option(None, "pick the best throughput whose p99 is within this; exit 1 if none")
    data: str | None = option(
        None,
        "held-out data (digits | synthetic | FILE.npz | FILE.csv, as for eval): answers are checked against "
        "its labels; default: synthetic inputs built from the signature",
    )
    limit: int = option(1024, "requests cycle through the first N examples of --data", parse=positive_int)
    fill: dict[str, float] = option(
        factory=dict,
        help="INPUT=NUMBER[,...]: synthetic inputs: fill INPUT with NUMBER (default: random)",
        parse=parse_fill,
    )
    seed: int = option(0, "seed of the Poisson arrivals and the synthetic inputs")
    mark_origin: bool = option(
        True,
        "send x-trainserve-origin: load, so that no capture records these calls (false: captured like any "
        "client's, e.g. to measure what capture costs)",
        parse=parse_bool,
    )
    pin_version: bool = option(
        True,
        "each request names the version the target resolved to at the start (false: the --label, or no version, "
        "as a client asks: a proxy that routes `stable` then routes them)",
        parse=parse_bool,
    )
    during: str | None = option(
        None,
        "run COMMAND under one steady load (one --concurrency or --rate, one --batch-sizes) and report the "
        "target's throughput and p50/p99 before, during and after it, e.g. a version load: "
        "'trainserve candidate --model digits'",
        metavar="COMMAND",
    )
    before_s: float = option(10.0, "with --during: seconds of load before COMMAND starts")
    after_s: float = option(10.0, "with --during: seconds of load after COMMAND ends and the versions settle")
    settle_timeout_s: float = option(
        300.0, "with --during: at most this long after COMMAND for a version change to be seen and finish"
    )
    bucket_s: float = option(1.0, "with --during: seconds per point of the timeline")

    @property
    def origin(self) -> str | None:
        """The origin header load's calls carry (traffic.origin), or None when --mark-origin=false."""
        return LOAD if self.mark_origin else None

    def check(self) -> None:
        """Every flag judged before the first request."""
        self.check_client()
        if self.window_s <= 0:
            raise TrainserveError(f"--window-s {self.window_s:g}: expected seconds > 0")
        if self.max_windows < 3:
            raise TrainserveError(f"--max-windows {self.max_windows}: expected >= 3 (stability compares 3 windows)")
        if self.latency_budget_ms is not None and self.latency_budget_ms <= 0:
            raise TrainserveError(f"--latency-budget-ms {self.latency_budget_ms:g}: expected milliseconds > 0")
        if self.fill and self.data is not None:
            raise TrainserveError("--fill and --data both given: --fill shapes synthetic inputs, used without --data")
        if self.during is not None:
            self.check_during()

    def check_during(self) -> None:
        loads = len(self.concurrency or ()) + len(self.rate or ())
        if loads != 1 or len(self.batch_sizes) != 1:
            raise TrainserveError(
                "--during measures one steady load: expected one --concurrency or --rate value and one "
                "--batch-sizes value"
            )
        argv = shlex.split(self.during)
        if not argv or shutil.which(argv[0]) is None:
            raise TrainserveError(f"--during {self.during!r}: expected a command that exists")
        for name in ("before_s", "after_s", "settle_timeout_s", "bucket_s"):
            if not getattr(self, name) > 0:
                raise TrainserveError(f"--{name.replace('_', '-')} {getattr(self, name):g}: expected seconds > 0")

    @property
    def concurrencies(self) -> tuple[int, ...]:
        if self.concurrency is None and self.rate is None:
            return DEFAULT_CONCURRENCY
        return self.concurrency or ()

    @property
    def rates(self) -> tuple[float, ...]:
        return self.rate or ()
