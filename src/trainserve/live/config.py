"""`trainserve live-eval`'s options, declared once (the CLI is derived from them). Free of TensorFlow."""

from __future__ import annotations

import argparse
import datetime
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from trainserve.errors import TrainserveError
from trainserve.files import ensure_writable_dir
from trainserve.margins import Margin, parse_margins
from trainserve.options import option, positive_int, share
from trainserve.shards import Shard, parse_shard

_WINDOW = re.compile(r"^\s*(\d+)\s*([mhd])\s*$")
_UNIT_SECONDS = {"m": 60, "h": 3600, "d": 86400}
Inconclusive = Literal["pass", "fail"]


def window_seconds(text: str) -> int | None:
    """`1h`, `1d`, `15m` -> seconds; `all` -> None (one window over everything read)."""
    if text.strip().lower() == "all":
        return None
    match = _WINDOW.match(text)
    if not match or int(match[1]) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a window such as 15m, 1h, 1d, or all")
    return int(match[1]) * _UNIT_SECONDS[match[2]]


def parse_window(text: str) -> str:
    window_seconds(text)
    return text.strip().lower()


def since_seconds(text: str, now: float) -> int:
    """`2026-11-30` or `2026-11-30T12:00` (UTC unless it says otherwise) -> UTC seconds; `7d`, `12h` -> that long
    before `now`."""
    if _WINDOW.match(text):
        return int(now) - window_seconds(text)
    when = datetime.datetime.fromisoformat(text.strip())
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return int(when.timestamp())


REGRESSION_DROPS = ("mse", "mae")  # the metrics --max-drop compares for regression: means of per-example errors


def parse_drop(text: str) -> float | str:
    """`0.02` (accuracy, a share), or eval's METRIC=DROP[%] (`accuracy=0.02`, `mse=0.1`, `mae=5%`)."""
    if "=" not in text:
        return share(text)
    margins = parse_margins(text)
    if len(margins) != 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected one METRIC=DROP, e.g. accuracy=0.02 or mse=0.1")
    margin = margins[0]
    if margin.metric not in ("accuracy", *REGRESSION_DROPS):
        raise argparse.ArgumentTypeError(
            f"{text!r}: live-eval compares accuracy (classification) or {', '.join(REGRESSION_DROPS)} (regression): "
            "expected one of those"
        )
    return margin.describe()


def drop_margin(value: float | str) -> Margin:
    """--max-drop as a margin: a bare number is an accuracy drop (what it always meant)."""
    if isinstance(value, int | float):
        return Margin("accuracy", float(value))
    return parse_margins(value)[0]


def parse_since(text: str) -> str:
    try:
        since_seconds(text, 0)
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected a UTC date or time (2026-11-30, 2026-11-30T12:00) or a duration back from now (7d)"
        ) from None
    return text.strip()


CONFIG_HELP = (
    "the serving config (models.config) whose `stable` the watch follows: the baseline is the eval report its "
    "promotion used (named in the config's history), and --on-drop rollback moves `stable` back in it"
)


@dataclass
class WatchConfig:
    """The watch across daily runs (trainserve.live.watch): flags --state, --config, --on-drop, --watch-against,
    --routing-file."""

    state: Path | None = option(
        None,
        "keep what this run counted of the `stable` version here (beside the capture): daily runs then form one "
        "anytime-valid test of its live accuracy against the baseline it was promoted on, each label counted once; "
        "a drop beyond --max-drop shown fails the run and, with --on-drop rollback, rolls back",
        flag="--state",
    )
    config: Path | None = option(None, CONFIG_HELP, flag="--config")
    on_drop: Literal["page", "rollback"] = option(
        "page",
        "what a drop shown by the watch does: page (exit 1, say so) or rollback (also move `stable` back to "
        "`previous` as `trainserve rollback` does, recorded in the rollout history)",
        flag="--on-drop",
    )
    against: Literal["held-out", "previous"] = option(
        "held-out",
        "the watch's baseline: held-out (the accuracy of the eval report promote used) or previous (paired: "
        "`previous`'s answers to the same labelled examples, where the capture has both)",
        flag="--watch-against",
    )
    routing_file: Path | None = option(
        None, "the proxy's routing file, released as `trainserve rollback` releases it", flag="--routing-file"
    )

    def check(self, config: LiveEvalConfig) -> None:
        """The watch's flags together, before anything is read."""
        if self.state is None:
            if self.on_drop == "rollback":
                raise TrainserveError("--on-drop rollback: expected --state (the watch that decides a rollback)")
            return
        if self.config is None or not self.config.is_file():
            raise TrainserveError(f"--state: expected --config naming the serving config (got {self.config})")
        if config.max_drop is None or drop_margin(config.max_drop).metric != "accuracy":
            raise TrainserveError("--state: expected --max-drop D, the accuracy drop the watch shows (e.g. 0.02)")
        if config.shard is not None:
            raise TrainserveError("--state: expected one client (no --shard): the state counts every label")
        ensure_writable_dir(self.state.parent, "--state")


@dataclass
class LiveEvalConfig:
    """Everything `trainserve live-eval` takes besides the capture paths; each field is the flag of the same name."""

    labels: Path | None = option(None, "the labels file (CSV with a header): one row per labelled example")
    key: str = option("request_id", "the labels file's column holding the request id (the client's x-request-id)")
    row_column: str = option(
        "request_row",
        "the labels file's column holding the example's row within a batched request (0 for the first); "
        "without this column every label is for row 0",
    )
    label_column: str = option(
        "label",
        "the labels file's column holding the true class (an index or a name); for a regression model the true number",
    )
    model: str = option("digits", "the model whose captured answers are scored")
    data_dir: Path | None = option(
        Path("data"), "where training wrote each version's record and held-out split (DIR/<model>/versions/)"
    )
    window: str = option("1d", "report per time window of the answers: 15m, 1h, 1d or all", parse=parse_window)
    since: str | None = option(
        None,
        "score only answers given from this UTC date or time (2026-11-30T12:00), or this long before now (7d): "
        "what the gates judge",
        parse=parse_since,
    )
    slice: tuple[str, ...] = option(
        (), "also report per value of this labels-file column or request input (one value per example)", repeat=True
    )
    min_accuracy: float | None = option(
        None,
        "fail (exit 1) when a version's live accuracy is shown below this (its interval's upper end); "
        "classification only",
        parse=share,
    )
    max_drop: float | str | None = option(
        None,
        "fail (exit 1) when --version is shown worse than --baseline-version by more than this: an accuracy drop "
        "(0.02), or METRIC=DROP[%%] (accuracy=0.02; regression: mse=0.1, mae=5%%) (paired on the requests both "
        "answered, else unpaired)",
        parse=parse_drop,
    )
    version: int | None = option(
        None, "the version the gates judge (default: the newest one captured)", parse=positive_int
    )
    baseline_version: int | None = option(
        None, "--max-drop compares with this version (default: the other one when two answered)", parse=positive_int
    )
    inconclusive: Inconclusive = option(
        "pass", "what a gate the data cannot decide yet does (too few labels): pass (and say so) or fail"
    )
    level: float = option(0.95, "confidence level of every interval")
    model_base_path: Path | None = option(
        None,
        "the model's base path (DIR/<version>/saved_model.pb): turns on the label-free estimate, calibrated on "
        "each version's held-out split (needs TensorFlow)",
    )
    calibrations: Path | None = option(
        None,
        "reuse the calibrations of an earlier live-eval report (the estimate without TensorFlow: the eval image); "
        "instead of --model-base-path",
    )
    max_ece: float = option(
        0.05,
        "flag a version's estimate when its expected calibration error on the held-out split exceeds this",
        parse=share,
    )
    max_psi: float = option(
        0.25,
        "flag a window's estimate when its answers' confidences moved from the held-out split's by more than this "
        "PSI (and more than sampling alone reaches at 1 %%): its stated error is widened by the share that moved",
        parse=float,
    )
    shard: Shard | None = option(
        None,
        "I/N: score the requests whose id hashes to I of N (every shard reads the whole capture)",
        parse=parse_shard,
    )
    report: Path | None = option(None, "write the JSON report here (and the HTML page beside it)")
    watch: WatchConfig = option(factory=WatchConfig)

    def since_s(self) -> int | None:
        """--since in UTC seconds (a duration counts back from now), or None."""
        return None if self.since is None else since_seconds(self.since, time.time())

    @property
    def window_s(self) -> int | None:
        """The window in seconds; None for one window over everything."""
        return window_seconds(self.window)

    def check(self) -> None:
        """Before reading anything: the labels file exists, the thresholds make sense, the report can be written."""
        if self.labels is None:
            raise TrainserveError("--labels: expected the labels file (CSV with a header)")
        if not self.labels.is_file():
            raise TrainserveError(f"--labels {self.labels}: no such file: expected a CSV of late labels")
        if not self.max_psi > 0:
            raise TrainserveError(f"--max-psi {self.max_psi}: expected a positive PSI, e.g. 0.25")
        if not 0 < self.level < 1:
            raise TrainserveError(f"--level {self.level}: expected a confidence level in (0, 1), e.g. 0.95")
        if self.baseline_version is not None and self.baseline_version == self.version:
            raise TrainserveError("--baseline-version: expected a version other than --version")
        if self.model_base_path is not None and self.calibrations is not None:
            raise TrainserveError("--model-base-path, --calibrations: expected one source of calibrations, not both")
        if self.calibrations is not None and not self.calibrations.is_file():
            raise TrainserveError(f"--calibrations {self.calibrations}: no such file: expected a live-eval report")
        if self.model_base_path is not None and not self.model_base_path.is_dir():
            raise TrainserveError(f"--model-base-path {self.model_base_path}: no such directory")
        if self.report is not None:
            ensure_writable_dir(self.report.parent, "--report")
        self.watch.check(self)
