"""The records of one evaluation, from a batch's answer to the finished run: what run.py produces and
report.py reads (kept apart so that neither imports the other)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trainserve.evaluation.config import EvalConfig
from trainserve.evaluation.data import EvalData
from trainserve.evaluation.metrics import ClassificationMetrics, RegressionMetrics
from trainserve.evaluation.plan import Plan


@dataclass(frozen=True)
class LocalComparison:
    """One batch's served answer against the same SavedModel run in-process (--compare-local)."""

    max_abs_diff: float  # largest |served - local| in the evaluated output
    agreeing: int | None  # examples whose served and local classes match (classification)


@dataclass(frozen=True)
class BatchAnswer:
    """The server's answer to one batch, with the batch's true labels."""

    version: int
    labels: np.ndarray
    output: np.ndarray  # the evaluated output, as served
    classes: np.ndarray | None  # the served `classes` output, where the plan uses it
    latency_s: float
    retries: int
    local: LocalComparison | None  # None without --compare-local
    unknown: np.ndarray | None = None  # per example: category values training never saw (tabular models)
    nonfinite: int = 0  # examples whose output held NaN or an infinity (the run is refused once it ends)


@dataclass
class Tally:
    """Running totals; each batch is added once, whatever order the answers come in."""

    plan: Plan
    quality: ClassificationMetrics | RegressionMetrics
    requests: int = 0
    retries: int = 0
    latencies: list[float] = field(default_factory=list)
    local_max_abs_diff: float = 0.0
    local_agree: int | None = None
    unknown_cells: int = 0  # category values training never saw (served through the OOV bucket)
    unknown_examples: int = 0  # examples holding at least one
    nonfinite: int = 0  # examples whose output was not a number

    @property
    def examples(self) -> int:
        return self.quality.examples

    def add(self, answer: BatchAnswer) -> None:
        self.quality.add(answer.labels, answer.output, self.plan.output, answer.classes)
        self.requests += 1
        self.retries += answer.retries
        self.latencies.append(answer.latency_s)
        self.nonfinite += answer.nonfinite
        if answer.unknown is not None:
            self.unknown_cells += int(answer.unknown.sum())
            self.unknown_examples += int(np.count_nonzero(answer.unknown))
        if answer.local is not None:
            self.local_max_abs_diff = max(self.local_max_abs_diff, answer.local.max_abs_diff)
            if answer.local.agreeing is not None:
                self.local_agree = (self.local_agree or 0) + answer.local.agreeing


@dataclass(frozen=True)
class RunTotals:
    """What the batch loop leaves behind."""

    tally: Tally
    version: int | None  # the version every answer came from; None when the data had no examples
    wall_s: float


@dataclass(frozen=True)
class FinishedRun:
    """Everything the report is built from."""

    config: EvalConfig
    data: EvalData
    plan: Plan
    totals: RunTotals
    start_rss_mb: float
    peak_rss_mb: float
    data_check: object | None = None  # held_out.DataCheck: the data against the version's record
    comparison: dict | None = None  # comparison.summarize / no_baseline, with --compare-with
    evidence: dict | None = None  # proof.evidence_section: what the report proves


@dataclass
class EvalResult:
    report: dict
    passed: bool
    latencies_ms: list[float]
    tally: Tally  # what the plots are drawn from
    baseline: Tally | None = None  # the --compare-with version's, on the same examples
