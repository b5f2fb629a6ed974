"""The watch's statistics: one anytime-valid test of a promoted version's live accuracy, however many daily runs
look at it, against the baseline it was promoted on.

- Against its held-out accuracy (`--watch-against held-out`): the live accuracy's confidence sequence
  (trainserve.stats.sequential, the rollout's) at LIVE_SHARE of alpha, minus the held-out accuracy's one-sided
  Wilson bound at the rest. The held-out split was seen once, so its fixed-sample bound holds at every look; the
  union bound makes the difference leave its bounds, at any look, with probability at most alpha. Where the eval
  report is gone (only its accuracy is in the history), that accuracy is taken as exact, and the report says so.
- Against `previous`, paired (`--watch-against previous`): on the labelled examples both versions answered, the
  shares the promoted version alone got right and `previous` alone did, each with its confidence sequence at half
  of alpha. The union bound needs no independence between the two, so the same pairs may feed both.

A drop is shown when the upper bound of (live - baseline) is below minus the margin (--max-drop); alpha is the
one-sided rate of the gates' intervals, (1 - --level) / 2. The bounds depend on the counts only, so a run that
counts nothing new (a retried Job) gives the same bounds, and two days' labels counted at once the same as one
day's twice.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal

from trainserve.stats.distributions import z_quantile
from trainserve.stats.proportions import wilson_interval
from trainserve.stats.sequential import confidence_sequence, difference_sequence

Design = Literal["held-out", "previous"]
LIVE_SHARE = 0.5  # of alpha, for the live accuracy's sequence; the held-out bound takes the rest
SAID_DROP = 0.05  # the drop whose runs to show the command states (twice the margin where that is larger)
POWER_Z = z_quantile(0.95)  # runs_to_show: the day 95 % of versions with that drop have shown it by
MAX_RUNS = 730  # runs_to_show looks two years ahead at most


@dataclass(frozen=True)
class Baseline:
    """What the version was promoted on: `design`, the held-out accuracy (with its counts where the eval report is
    still there), or the `previous` version compared paired; `source` says where it came from."""

    design: Design
    accuracy: float | None = None
    correct: int | None = None
    examples: int | None = None
    version: int | None = None
    source: str = ""

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict) -> Baseline:
        return cls(**raw)

    def describe(self) -> str:
        if self.design == "previous":
            return f"version {self.version}'s answers to the same labelled examples (paired)"
        if self.examples is None:
            return f"held-out accuracy {self.accuracy:.4f} (taken as exact: {self.source})"
        return f"held-out accuracy {self.accuracy:.4f} on {self.examples} examples ({self.source})"


@dataclass
class Counts:
    """What the watch has counted over every run: `examples` labelled answers of the version (`correct` of them
    right); paired, the examples both answered, of which the version alone (`only`) or `previous` alone
    (`baseline_only`) was right."""

    examples: int = 0
    correct: int = 0
    only: int = 0
    baseline_only: int = 0

    def add(self, other: Counts) -> None:
        for name in ("examples", "correct", "only", "baseline_only"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


def one_sided_alpha(level: float) -> float:
    return (1 - level) / 2


def change_bounds(counts: Counts, baseline: Baseline, alpha: float) -> tuple[float, float]:
    """Anytime bounds of (live accuracy - baseline), each end missing at some look with probability <= alpha."""
    n = counts.examples
    if baseline.design == "previous":
        return difference_sequence((counts.only, n), (counts.baseline_only, n), alpha)
    if baseline.examples is None:
        low, high = confidence_sequence(counts.correct, n, alpha)
        return low - baseline.accuracy, high - baseline.accuracy
    low, high = confidence_sequence(counts.correct, n, alpha * LIVE_SHARE)
    level = 1 - 2 * alpha * (1 - LIVE_SHARE)  # a two-sided Wilson interval whose each end misses at the rest
    held_low, held_high = wilson_interval(baseline.correct, baseline.examples, level)
    return low - held_high, high - held_low


def verdict(bounds: tuple[float, float], margin: float) -> str:
    """`drop shown` (beyond the margin), `within the margin` (shown so far; the watch goes on) or `not shown yet`."""
    if bounds[1] < -margin:
        return "drop shown"
    if bounds[0] >= -margin:
        return "within the margin"
    return "not shown yet"


def said_drop(margin: float) -> float:
    return max(SAID_DROP, 2 * margin)


@dataclass(frozen=True)
class Pace:
    """What the runs so far say of the label rate: `runs` nights run, `counted` labelled examples counted,
    `per_run` counted a night; paired, `disagreement`, the share of pairs where the versions disagree."""

    runs: int
    counted: int
    per_run: float
    disagreement: float = 0.0


def runs_to_show(pace: Pace, baseline: Baseline, margin: float, alpha: float) -> int | None:
    """After how many daily runs in all (those run included) a drop of said_drop(margin) shows in about 95 % of
    versions that have it: the examples counted so far plus `per_run` a run from now on, their count of right
    answers 1.645 standard deviations above the mean, the held-out accuracy's own noise included. None: not within
    MAX_RUNS, or never (the baseline's own uncertainty leaves no room)."""
    if pace.per_run <= 0:
        return None

    def shown(runs: int) -> bool:
        n = pace.counted + round((runs - pace.runs) * pace.per_run)
        if n <= 0:
            return False
        counts = _pessimistic(n, said_drop(margin), pace.disagreement, baseline)
        return verdict(change_bounds(counts, baseline, alpha), margin) == "drop shown"

    if not shown(MAX_RUNS):
        return None
    low, high = pace.runs, MAX_RUNS  # more labels narrow the bounds: bisect for the first run that shows it
    if shown(low):
        return max(low, 1)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if shown(middle) else (middle, high)
    return high


def _pessimistic(n: int, drop: float, disagreement: float, baseline: Baseline) -> Counts:
    """The counts of `n` examples of a version `drop` below its baseline, 1.645 standard deviations luckier than
    its mean (the slow case for showing the drop)."""
    if baseline.design == "previous":
        disagree = max(disagreement, drop)
        only, base_only = (disagree - drop) / 2, (disagree + drop) / 2
        spread = POWER_Z * math.sqrt(n * max(disagree - drop * drop, 0.0)) / 2
        return Counts(n, 0, round(min(n * only + spread, n)), round(max(n * base_only - spread, 0)))
    p = max(baseline.accuracy - drop, 0.0)
    # The drop is from the version's true accuracy, which the held-out split measured with its own noise: the live
    # accuracy seen stands 1.645 standard deviations of (live - held-out) above the held-out accuracy minus the drop.
    b, n_b = baseline.accuracy, baseline.examples
    variance = p * (1 - p) / n + (b * (1 - b) / n_b if n_b else 0.0)
    return Counts(n, round(min(n * (p + POWER_Z * math.sqrt(variance)), n)))
