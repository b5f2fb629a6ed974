"""What replay counts while the answers come back, kept in a form that adds across shards exactly: the flip matrix
(baseline's top class -> candidate's), fixed-edge histograms (probability shifts, regression differences,
latencies), sums and extremes, error counts. A report holds this state, so `replay-merge` rebuilds each shard's
tally, adds them, and derives the same figures one client would have.

Statistics use numpy and the standard library only (the light client has no scipy; tests compare with scipy).
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

SHIFT_BINS = 200  # probability shift in [0, 1]: bins of 0.005
# |regression difference| and latency (ms): geometric bins, each edge 2 % above the last, 1e-9 .. 1e9.
LOG_RATIO, LOG_LOW, LOG_BINS = 1.02, 1e-9, int(math.ceil(math.log(1e18) / math.log(1.02)))


def log_edges() -> np.ndarray:
    return LOG_LOW * LOG_RATIO ** np.arange(LOG_BINS + 1)


def log_bin(values: np.ndarray) -> np.ndarray:
    """Bin index of each value on log_edges (0 and below in bin 0, beyond the last in the last)."""
    v = np.maximum(np.asarray(values, np.float64), LOG_LOW)
    return np.clip(np.floor(np.log(v / LOG_LOW) / math.log(LOG_RATIO)).astype(np.int64), 0, LOG_BINS - 1)


def histogram_quantile(counts: np.ndarray, edges: np.ndarray, q: float, observed_max: float | None = None) -> float:
    """The upper edge of the bin holding quantile q (at most one bin width above the exact value), and never above
    the largest value observed (the bin's edge can be: a quantile above the maximum is no quantile)."""
    total = counts.sum()
    if not total:
        return 0.0
    index = int(np.searchsorted(np.cumsum(counts), q * total, side="left"))
    edge = float(edges[min(index + 1, len(edges) - 1)])
    return edge if observed_max is None else min(edge, float(observed_max))


class Spread:
    """count, sum, sum of squares, min, max: mean and standard deviation that add across shards."""

    def __init__(self, state: dict | None = None):
        s = state or {}
        self.count, self.total, self.squares = s.get("count", 0), s.get("sum", 0.0), s.get("sum_squares", 0.0)
        self.low, self.high = s.get("min"), s.get("max")

    def add(self, values: np.ndarray) -> None:
        v = np.asarray(values, np.float64).ravel()
        if not v.size:
            return
        self.count += int(v.size)
        self.total += float(v.sum())
        self.squares += float(np.square(v).sum())
        self.low = float(v.min()) if self.low is None else min(self.low, float(v.min()))
        self.high = float(v.max()) if self.high is None else max(self.high, float(v.max()))

    def merge(self, other: Spread) -> None:
        self.count, self.total, self.squares = (
            self.count + other.count,
            self.total + other.total,
            self.squares + other.squares,
        )
        lows, highs = (
            [x for x in (self.low, other.low) if x is not None],
            [x for x in (self.high, other.high) if x is not None],
        )
        self.low, self.high = min(lows, default=None), max(highs, default=None)

    def state(self) -> dict:
        return {"count": self.count, "sum": self.total, "sum_squares": self.squares, "min": self.low, "max": self.high}

    def summary(self) -> dict:
        mean = self.total / self.count if self.count else 0.0
        var = max(0.0, self.squares / self.count - mean * mean) if self.count else 0.0
        return {"mean": mean, "sd": math.sqrt(var), "min": self.low, "max": self.high}


class ReplayTally:
    """Everything one replay (or one shard of it) counted."""

    def __init__(self, classes: int = 0, like: ReplayTally | None = None):
        """`like`: a tally (with no classes yet) whose counts this one takes over."""
        self.classes = classes
        self.flips = np.zeros((classes, classes), np.int64)  # [baseline class, candidate class]
        self.shift = np.zeros(SHIFT_BINS, np.int64)  # max |p_candidate - p_baseline| over classes, per example
        self.shift_spread = Spread()
        self.difference = Spread()  # candidate - baseline, regression, every example and target
        self.abs_difference = np.zeros(LOG_BINS, np.int64)
        self.latency = {side: np.zeros(LOG_BINS, np.int64) for side in ("candidate", "baseline")}
        self.latency_spread = {side: Spread() for side in ("candidate", "baseline")}
        self.errors = {side: Counter() for side in ("candidate", "baseline")}
        self.refused_by_both = 0  # pairs both sides refused as INVALID_ARGUMENT: the request's fault
        self.requests = self.paired = self.examples = 0
        if like is not None:
            self.latency, self.latency_spread, self.errors = like.latency, like.latency_spread, like.errors
            self.requests, self.paired, self.examples = like.requests, like.paired, like.examples
            self.refused_by_both = like.refused_by_both

    def add_classification(self, candidate: np.ndarray, baseline: np.ndarray) -> None:
        """Both versions' probabilities [N, K] for the same N examples."""
        np.add.at(self.flips, (baseline.argmax(axis=1), candidate.argmax(axis=1)), 1)
        shift = np.abs(candidate - baseline).max(axis=1)
        self.shift += np.bincount(
            np.minimum((shift * SHIFT_BINS).astype(np.int64), SHIFT_BINS - 1), minlength=SHIFT_BINS
        )
        self.shift_spread.add(shift)
        self.examples += len(candidate)

    def add_regression(self, candidate: np.ndarray, baseline: np.ndarray) -> None:
        difference = (candidate.astype(np.float64) - baseline).reshape(len(candidate), -1)
        self.difference.add(difference)
        self.abs_difference += np.bincount(log_bin(np.abs(difference).ravel()), minlength=LOG_BINS)
        self.examples += len(candidate)

    def add_latency(self, side: str, seconds: float) -> None:
        self.latency[side][log_bin(np.array([seconds * 1000]))[0]] += 1
        self.latency_spread[side].add(np.array([seconds * 1000]))

    def merge(self, other: ReplayTally) -> None:
        self.flips += other.flips
        self.shift += other.shift
        self.abs_difference += other.abs_difference
        for spread, theirs in ((self.shift_spread, other.shift_spread), (self.difference, other.difference)):
            spread.merge(theirs)
        for side in self.latency:
            self.latency[side] += other.latency[side]
            self.latency_spread[side].merge(other.latency_spread[side])
            self.errors[side].update(other.errors[side])
        self.requests, self.paired = self.requests + other.requests, self.paired + other.paired
        self.examples += other.examples
        self.refused_by_both += other.refused_by_both

    def flip_count(self) -> int:
        return int(self.flips.sum() - np.trace(self.flips))

    def state(self) -> dict:
        """The tally as the report stores it (sparse histograms: {bin: count})."""
        sparse = lambda counts: {str(i): int(c) for i, c in enumerate(counts) if c}  # noqa: E731
        return {
            "classes": self.classes,
            "flip_matrix": self.flips.tolist(),
            "shift_bins": sparse(self.shift),
            "shift": self.shift_spread.state(),
            "difference": self.difference.state(),
            "abs_difference_bins": sparse(self.abs_difference),
            "latency_bins": {side: sparse(c) for side, c in self.latency.items()},
            "latency": {side: s.state() for side, s in self.latency_spread.items()},
            "errors": {side: dict(c) for side, c in self.errors.items()},
            "refused_by_both": self.refused_by_both,
            "requests": self.requests,
            "paired": self.paired,
            "examples": self.examples,
        }

    @classmethod
    def from_state(cls, state: dict) -> ReplayTally:
        tally = cls(state["classes"])
        dense = lambda bins, size: np.bincount(  # noqa: E731
            [int(k) for k in bins], weights=list(bins.values()), minlength=size
        ).astype(np.int64)
        tally.flips = np.asarray(state["flip_matrix"], np.int64).reshape(tally.classes, tally.classes)
        tally.shift, tally.shift_spread = dense(state["shift_bins"], SHIFT_BINS), Spread(state["shift"])
        tally.difference = Spread(state["difference"])
        tally.abs_difference = dense(state["abs_difference_bins"], LOG_BINS)
        for side in ("candidate", "baseline"):
            tally.latency[side] = dense(state["latency_bins"][side], LOG_BINS)
            tally.latency_spread[side] = Spread(state["latency"][side])
            tally.errors[side] = Counter(state["errors"][side])
        tally.requests, tally.paired, tally.examples = state["requests"], state["paired"], state["examples"]
        tally.refused_by_both = state["refused_by_both"]
        return tally
