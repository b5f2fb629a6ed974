"""`trainserve eval`'s options, declared once: type, default and help. The CLI is derived from them.

Kept free of TensorFlow and gRPC so that `trainserve eval --help` answers at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from trainserve.errors import TrainserveError
from trainserve.evaluation.gates import ChangeGate, Gate, parse_change_gates, parse_gates
from trainserve.evaluation.preflight import AUTO, CEILING, FLOOR
from trainserve.evaluation.slicing import parse_slice, parse_slice_margin
from trainserve.files import ensure_writable_dir
from trainserve.layout import DEFAULT_SIGNATURE
from trainserve.margins import Margin, parse_margins
from trainserve.options import key_values, option, parse_bool, positive_int
from trainserve.shards import Shard, parse_shard
from trainserve.sources.synthetic import SyntheticSpec
from trainserve.task import Task
from trainserve.tls import ClientTls

TaskChoice = Literal["auto", "classification", "regression"]
# The metrics a gate may name, by task (evaluation/metrics.py computes them).
GATE_METRICS = {
    "classification": ("accuracy", "top_k_accuracy", "loss", "roc_auc", "average_precision"),
    "regression": ("mse", "rmse", "mae", "r2", "loss"),
}


def parse_input_map(text: str) -> dict[str, str]:
    """`key=input[,key=input...]` -> {data key: signature input}."""
    return key_values(text, str, "KEY=INPUT (a data key, a signature input)")


def optional_text(text: str) -> str | None:
    """An empty value (`TRAINSERVE_COMPARE_WITH=`) is none: how a Makefile or compose turns an option off."""
    return text.strip() or None


def parse_max_drop(text: str) -> tuple[Margin, ...] | None:
    """`accuracy=0.01,loss=5%` -> margins; empty or `auto` -> None (the default margin); `none` -> () (no
    margin)."""
    if text.strip().lower() in ("", AUTO):
        return None
    return () if text.strip().lower() == "none" else parse_margins(text)


def optional_float(text: str) -> float | None:
    return float(text) if text.strip() else None


def check_gates(gates: tuple[Gate, ...], task: Task) -> None:
    """Before the first request: every gate names a metric this task reports."""
    for gate in gates:
        if gate.metric not in GATE_METRICS[task.kind]:
            raise TrainserveError(
                f"gate {gate.describe()}: {task.kind} reports no {gate.metric!r}: expected one of "
                f"{', '.join(GATE_METRICS[task.kind])}"
            )


@dataclass
class ClientOptions:
    """The flags every client of a served model takes (`eval`, `load`): which version of which model, how
    to reach it, and how the data meets its signature."""

    server: str = option("localhost:8500", "gRPC HOST:PORT")
    model: str = option("digits", "model name")
    version: int | None = option(None, "this version (default: newest)", parse=positive_int)
    label: str | None = option(None, "the version behind this label")
    signature: str = option(DEFAULT_SIGNATURE, "SignatureDef to call")
    label_column: str | None = option(None, "the label's column of a --data FILE.csv")
    input_map: dict[str, str] = option(
        factory=dict,
        help="KEY=INPUT[,...]: feed data KEY to signature INPUT (default: same names)",
        parse=parse_input_map,
    )
    task: TaskChoice = option("auto", "what the labels are (auto: the shared split's task, else the labels' dtype)")
    output: str | None = option(None, "the output to judge (default: probabilities / predictions / the only float)")
    wait: float = option(60.0, "seconds to wait for the model to be AVAILABLE")
    tls: ClientTls = option(factory=ClientTls)  # --tls-ca, --tls-cert, --tls-key, --tls-server-name
    timeout: float = option(10.0, "seconds per request attempt")
    report: Path | None = option(None, "write the JSON report here")
    plots: Path | None = option(None, "write the plots here (a directory)")

    def check_client(self) -> None:
        """The shared flags judged before the first request."""
        if self.version is not None and self.label:
            raise TrainserveError("--version and --label both given: expected at most one")
        if self.wait < 0:
            raise TrainserveError(f"--wait {self.wait:g}: expected seconds >= 0")
        if self.timeout <= 0:
            raise TrainserveError(f"--timeout {self.timeout:g}: expected seconds > 0")
        self.tls.check()
        # Before any request: an unwritable destination must not cost a whole run.
        if self.report is not None:
            ensure_writable_dir(self.report.parent, "--report")
        if self.plots is not None:
            ensure_writable_dir(self.plots, "--plots")


@dataclass
class EvalConfig(ClientOptions):
    """Everything `trainserve eval` takes; each field is the flag of the same name."""

    data: str = option(
        "auto",
        "auto (held-out where --data-dir has the version's record, else digits) | held-out (the served "
        "version's own split, from --data-dir) | digits | synthetic | FILE.npz (x_test or x_test/<input>, y_test) "
        "| FILE.csv | IMAGE_FOLDER",
    )
    data_dir: Path | None = option(
        Path("data"),
        "where training shares each version's held-out split and record "
        "(DIR/<model>/versions/<version>.json): the data is checked against it",
    )
    batch_size: int = option(256, "examples per request", parse=positive_int)
    concurrency: int = option(4, "requests in flight", parse=positive_int)
    retries: int = option(5, "retries of UNAVAILABLE/DEADLINE_EXCEEDED/RESOURCE_EXHAUSTED")
    limit: int | None = option(None, "evaluate only the first N examples", parse=positive_int)
    shard: Shard | None = option(
        None, "I/N: evaluate every N-th batch from batch I (merge: trainserve report merge)", parse=parse_shard
    )
    top_k: int = option(5, "k of the top-k accuracy", parse=positive_int)
    min_accuracy: float | None = option(
        None, "exit 1 when accuracy is below this (the same as --require accuracy>=X)", parse=optional_float
    )
    require: tuple[Gate, ...] = option((), "METRIC>=X or METRIC<=X[,...]: exit 1 unless all hold", parse=parse_gates)
    compare_with: str | None = option(
        None,
        "VERSION|LABEL: send every batch to this version too; paired comparison, "
        "gated on not being significantly worse",
        parse=optional_text,
    )
    allow_no_baseline: bool = option(
        False,
        "with --compare-with LABEL and --rollout-config: when the config labels no version LABEL (the first "
        "rollout), the value gates alone decide",
    )
    rollout_config: Path | None = option(
        None,
        "the serving config the rollout steps own (models.config): its labels say whether a baseline exists",
    )
    skip_during_rollout: bool = option(
        False,
        "with --rollout-config: while a rollout of --model is in progress, evaluate nothing and exit 0 (logged): a "
        "retried rollout Job's controller resumes on the report its rollout began on, and during its bake no "
        "`candidate` is labelled to evaluate",
    )
    not_worse: bool = option(
        True,
        "with --compare-with --max-drop none: exit 1 when significantly worse (absence of evidence: promote "
        "refuses a comparison gated only so; false: report only)",
        parse=parse_bool,
    )
    max_drop: tuple[Margin, ...] | None = option(
        None,
        "METRIC=DROP[%%][,...]: with --compare-with, the non-inferiority gate: pass only when the 95%% interval "
        "shows METRIC fell by less than DROP (absolute, or %% of the baseline's value; the interval's lower end "
        "is a one-sided 2.5%% bound); too few examples to tell is 'inconclusive', which does not pass (default, "
        "or auto: the smallest accuracy margin the examples decide with 80%% power at --assume-discordance, "
        f"within [{FLOOR:g}, {CEILING:g}], said before any request; mse=5%% for regression; none: no margin, only 'not "
        "significantly worse', which promote refuses)",
        parse=parse_max_drop,
    )
    assume_discordance: float = option(
        0.03,
        "with --compare-with on accuracy: the share of examples the two versions are assumed to disagree on, "
        "for the pre-flight's smallest decidable margin and the default margin (the observed share is reported "
        "after the run, with the power it left the margin)",
        parse=float,
    )
    require_power: bool = option(
        False,
        "with --compare-with: refuse (exit 2, before any request) when an accuracy --max-drop is below the "
        "smallest margin the examples decide with 80%% power",
    )
    alpha: float = option(
        0.05,
        "two-sided level of the comparison's test and its 1 - ALPHA intervals; a gate judged on an interval's "
        "end (--max-drop, --max-drop-per-slice) is one-sided at ALPHA / 2 (2.5 %% at 0.05)",
    )
    require_vs_baseline: tuple[ChangeGate, ...] = option(
        (),
        "METRIC>=CHANGE or METRIC<=CHANGE[%%][,...]: change thresholds vs --compare-with, on the point estimates "
        "(TFMA's meaning; --max-drop is the form judged on the interval)",
        parse=parse_change_gates,
    )
    slice: tuple[tuple[str, ...], ...] = option(
        (),
        "with --compare-with: the comparison per slice of the examples sharing a value of COLUMN (a CSV "
        "column, an npz key, or class); repeatable, COLUMN,COLUMN crosses (default: per class, per target)",
        parse=parse_slice,
        repeat=True,
        metavar="COLUMN[,COLUMN]",
    )
    slice_correction: Literal["holm", "bh"] = option(
        "holm", "the slices' multiplicity correction: holm (family-wise error) or bh (false discovery rate)"
    )
    gate_slices: bool = option(
        False, "with --compare-with: exit 1 when any slice is significantly worse (after the correction)"
    )
    max_drop_per_slice: Margin | None = option(
        None,
        "METRIC=DROP[%%]: with --compare-with, a non-inferiority gate on every slice (accuracy, or mse for "
        "regression), judged on each slice's multiplicity-adjusted interval: a slice too small to tell is "
        "'inconclusive', which does not pass",
        parse=parse_slice_margin,
    )
    seed: int = option(0, "seed of the comparison's bootstrap and sign-flip resampling")
    compare_local: Path | None = option(None, "also run this SavedModel version dir in-process on CPU")
    synthetic: SyntheticSpec = option(factory=SyntheticSpec)

    def check(self) -> None:
        self.check_client()
        self.check_comparison()
        if self.skip_during_rollout and self.rollout_config is None:
            raise TrainserveError("--skip-during-rollout: expected --rollout-config FILE (whose history says so)")
        for name in ("batch_size", "concurrency"):
            if getattr(self, name) < 1:
                raise TrainserveError(f"--{name.replace('_', '-')} {getattr(self, name)}: expected >= 1")
        if self.retries < 0:
            raise TrainserveError(f"--retries {self.retries}: expected >= 0")
        if self.compare_local is not None:
            from trainserve.savedmodel import require_tensorflow

            require_tensorflow("--compare-local")  # before waiting on the server, not after
            if not (self.compare_local / "saved_model.pb").is_file():
                raise TrainserveError(f"--compare-local {self.compare_local}: expected a SavedModel version directory")

    def check_comparison(self) -> None:
        # --allow-no-baseline and --max-drop alone are harmless: compose sets them, COMPARE_WITH= not.
        if self.compare_with is None:
            if self.require_vs_baseline or self.slice or self.gate_slices or self.max_drop_per_slice:
                raise TrainserveError(
                    "--require-vs-baseline/--slice/--gate-slices/--max-drop-per-slice without --compare-with: "
                    "expected the version or label to compare with"
                )
            return
        if self.shard is not None or self.compare_local is not None or self.limit is not None:
            raise TrainserveError(
                "--compare-with compares two versions on every example: expected no --shard, --limit or "
                "--compare-local with it"
            )
        if self.allow_no_baseline and self.rollout_config is None and not self.compare_with.isdigit():
            raise TrainserveError(
                "--allow-no-baseline: expected --rollout-config FILE with it (the serving config whose labels say "
                "that no version holds the label yet: a failed lookup is not a first rollout)"
            )
        if self.rollout_config is not None and not self.rollout_config.is_file():
            raise TrainserveError(f"--rollout-config {self.rollout_config}: no such file (expected models.config)")
        if not 0 < self.assume_discordance <= 1:
            raise TrainserveError(f"--assume-discordance {self.assume_discordance:g}: expected a share in (0, 1]")
        if not 0 < self.alpha < 1:
            raise TrainserveError(f"--alpha {self.alpha:g}: expected a significance level between 0 and 1")

    @property
    def gates(self) -> tuple[Gate, ...]:
        accuracy = (Gate("accuracy", ">=", self.min_accuracy),) if self.min_accuracy is not None else ()
        return accuracy + tuple(self.require)
