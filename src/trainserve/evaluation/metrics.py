"""The task's metrics, accumulated batch by batch so that each example counts once whatever the order.

Classification: accuracy, top-k, cross-entropy, confusion matrix and per-class precision/recall/F1; for
two classes also ROC AUC and average precision (the area under the precision-recall curve, as
scikit-learn's `average_precision_score` defines it). Outputs that are logits rather than probabilities
are detected on the first answer and turned into probabilities with a softmax (sigmoid for one score),
so the loss is the model's real cross-entropy. Regression: MSE, RMSE, MAE and R2, per target and
overall (R2 averaged over targets, as scikit-learn's `r2_score`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trainserve.class_scores import OutputKind, log_probabilities, output_kind, per_class
from trainserve.errors import TrainserveError
from trainserve.task import Task


def predicted_classes(scores: np.ndarray, output: str) -> np.ndarray:
    """The most likely class of each example, from scores of whichever kind they are."""
    scores = scores.reshape(len(scores), -1)
    return log_probabilities(scores, output_kind(scores, output)).argmax(axis=1)


@dataclass
class ClassificationMetrics:
    task: Task
    top_k: int
    kind: OutputKind | None = None  # decided by the first answer
    examples: int = 0
    correct: int = 0
    top_k_hits: int = 0
    loss_sum: float = 0.0
    confusion: np.ndarray = field(init=False)
    binary_labels: list[np.ndarray] = field(default_factory=list)  # two classes: kept for ROC / PR
    binary_scores: list[np.ndarray] = field(default_factory=list)

    def __post_init__(self):
        self.confusion = np.zeros((self.task.classes, self.task.classes), np.int64)

    def add(self, labels: np.ndarray, scores: np.ndarray, output: str, classes: np.ndarray | None = None) -> None:
        """One answer: `scores` [N, K] or [N] / [N, 1] (binary); `classes` the served ones, if any."""
        scores = scores.reshape(len(labels), -1)
        if scores.shape[1] not in (1, self.task.classes):
            raise TrainserveError(
                f"server answered {output!r} shaped {list(scores.shape)}: expected [{len(labels)}, {self.task.classes}]"
            )
        # Logits may fall inside [0, 1] in any one batch, probabilities never outside it: once logits, always.
        if self.kind != "logits":
            kind = output_kind(scores, output)
            if self.kind == "probabilities" and kind == "logits":
                raise TrainserveError(
                    f"output {output!r} answered values outside [0, 1] after answering probabilities: expected one kind"
                )
            self.kind = kind
        log_p = log_probabilities(scores, self.kind)
        predicted = classes.astype(np.int64) if classes is not None else log_p.argmax(axis=1)
        self.examples += len(labels)
        self.correct += int(np.sum(predicted == labels))
        k = min(self.top_k, self.task.classes)
        top = np.argpartition(-log_p, k - 1, axis=1)[:, :k]
        self.top_k_hits += int(np.sum(np.any(top == labels[:, None], axis=1)))
        self.loss_sum += float(-np.sum(log_p[np.arange(len(labels)), labels]))
        np.add.at(self.confusion, (labels, predicted), 1)
        if self.task.classes == 2:
            self.binary_labels.append(labels.astype(np.int8))
            self.binary_scores.append(np.exp(log_p[:, 1]).astype(np.float32))

    def binary_curve_inputs(self) -> tuple[np.ndarray, np.ndarray]:
        return np.concatenate(self.binary_labels or [np.zeros(0, np.int8)]), np.concatenate(
            self.binary_scores or [np.zeros(0, np.float32)]
        )

    def summary(self) -> dict:
        n = max(self.examples, 1)
        summary = {
            "accuracy": self.correct / n,
            "top_k": min(self.top_k, self.task.classes),
            "top_k_accuracy": self.top_k_hits / n,
            "loss": self.loss_sum / n,
            "output_kind": self.kind or "probabilities",
            "per_class": per_class(self.confusion, list(self.task.label_names)),
            "confusion_matrix": self.confusion.tolist(),
        }
        if self.task.classes == 2:
            labels, scores = self.binary_curve_inputs()
            summary["roc_auc"] = roc_auc(labels, scores)
            summary["average_precision"] = average_precision(labels, scores)
            summary["score_histogram"] = score_histogram(labels, scores)
        return summary


@dataclass
class RegressionMetrics:
    task: Task
    examples: int = 0
    squared_error: np.ndarray = field(init=False)
    absolute_error: np.ndarray = field(init=False)
    label_mean: np.ndarray = field(init=False)  # running mean and sum of squared deviations (Chan et al.),
    label_m2: np.ndarray = field(init=False)  # for R2's total sum of squares without cancellation
    truths: list[np.ndarray] = field(default_factory=list)  # kept for the plots
    predictions: list[np.ndarray] = field(default_factory=list)

    def __post_init__(self):
        zeros = lambda: np.zeros(self.task.targets, np.float64)  # noqa: E731
        self.squared_error, self.absolute_error, self.label_mean, self.label_m2 = zeros(), zeros(), zeros(), zeros()

    def add(self, labels: np.ndarray, predictions: np.ndarray, output: str, classes=None) -> None:
        n, targets = labels.shape
        if predictions.size != n * targets:
            raise TrainserveError(
                f"server answered {output!r} shaped {list(predictions.shape)}: expected [{n}, {targets}]"
            )
        predictions = predictions.reshape(n, targets)
        error = predictions.astype(np.float64) - labels
        mean = labels.mean(axis=0, dtype=np.float64)
        self.merge(
            n, np.sum(error**2, axis=0), np.sum(np.abs(error), axis=0), mean, np.sum((labels - mean) ** 2, axis=0)
        )
        self.truths.append(labels)
        self.predictions.append(predictions.astype(np.float32))

    def merge(self, n: int, squared_error, absolute_error, label_mean, label_m2) -> None:
        """Add the sums of `n` more examples (a batch, or a whole shard's report): error sums add, and the
        labels' mean and squared deviations combine exactly (Chan, Golub and LeVeque's pairwise update)."""
        total = self.examples + n
        if total == 0:
            return
        delta = np.asarray(label_mean) - self.label_mean
        self.squared_error += squared_error
        self.absolute_error += absolute_error
        self.label_mean += delta * n / total
        self.label_m2 += np.asarray(label_m2) + delta**2 * self.examples * n / total
        self.examples = total

    def summary(self) -> dict:
        n = max(self.examples, 1)
        mse, mae = self.squared_error / n, self.absolute_error / n
        # R2 = 1 - SSE / SST; a constant target (SST 0) scores 1 when predicted exactly, else 0 (scikit-learn).
        r2 = np.where(
            self.label_m2 > 0,
            1 - self.squared_error / np.where(self.label_m2 > 0, self.label_m2, 1),
            np.where(self.squared_error == 0, 1.0, 0.0),
        )
        per_target = [
            {
                "target": str(t),
                "mse": mse[t],
                "rmse": float(np.sqrt(mse[t])),
                "mae": mae[t],
                "r2": r2[t],
                "label_mean": self.label_mean[t],
                "label_sum_sq_dev": self.label_m2[t],
            }
            for t in range(self.task.targets)
        ]
        overall = float(mse.mean())
        return {
            "mse": overall,
            "rmse": float(np.sqrt(overall)),
            "mae": float(mae.mean()),
            "r2": float(r2.mean()),
            "loss": overall,
            "per_target": per_target,
        }

    def plot_inputs(self) -> tuple[np.ndarray, np.ndarray]:
        """(truth, prediction), both [N, T]."""
        empty = np.zeros((0, self.task.targets), np.float32)
        return np.concatenate(self.truths or [empty]), np.concatenate(self.predictions or [empty])


def task_metrics(task: Task, top_k: int) -> ClassificationMetrics | RegressionMetrics:
    return ClassificationMetrics(task, top_k) if task.kind == "classification" else RegressionMetrics(task)


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float | None:
    """Area under the ROC curve: the chance a positive outscores a negative (ties count half), from ranks.
    None when one class is absent (undefined)."""
    positives = int(np.sum(labels == 1))
    negatives = len(labels) - positives
    if positives == 0 or negatives == 0:
        return None
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    midranks = np.cumsum(counts) - (counts - 1) / 2.0  # 1-based rank of each distinct score, ties averaged
    rank_sum = float(np.sum(midranks[inverse][labels == 1]))
    return (rank_sum - positives * (positives + 1) / 2.0) / (positives * negatives)


def precision_recall_curve(labels: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(precision, recall) at each distinct score taken as the threshold, highest score first."""
    order = np.argsort(-scores, kind="stable")
    scores, hits = scores[order], (labels[order] == 1).astype(np.float64)
    last_of_each = np.r_[np.nonzero(np.diff(scores))[0], len(scores) - 1]
    true_pos = np.cumsum(hits)[last_of_each]
    predicted = last_of_each + 1.0
    return true_pos / predicted, true_pos / max(true_pos[-1], 1.0)


def average_precision(labels: np.ndarray, scores: np.ndarray) -> float | None:
    """Sum over thresholds of (recall gained) x precision; None without positives."""
    if not np.any(labels == 1):
        return None
    precision, recall = precision_recall_curve(labels, scores)
    return float(np.sum(np.diff(recall, prepend=0.0) * precision))


SCORE_BINS = 1000  # score histograms: what merged shard reports compute ROC AUC and average precision from


def score_histogram(labels: np.ndarray, scores: np.ndarray) -> dict:
    """Counts of class-1 scores in SCORE_BINS equal bins of [0, 1], per true class, as sparse {bin: count}."""
    bins = np.minimum((scores.astype(np.float64) * SCORE_BINS).astype(np.int64), SCORE_BINS - 1)
    return {
        "bins": SCORE_BINS,
        **{side: _sparse_counts(bins[labels == value]) for side, value in (("negative", 0), ("positive", 1))},
    }


def _sparse_counts(values: np.ndarray) -> dict[str, int]:
    found, counts = np.unique(values, return_counts=True)
    return {str(int(v)): int(c) for v, c in zip(found, counts)}


def curves_from_histogram(histogram: dict) -> tuple[float | None, float | None]:
    """(ROC AUC, average precision) from a score histogram: every score in a bin counts as tied, so each
    is exact up to the order of examples whose scores fall within 1/SCORE_BINS of each other."""
    n = histogram["bins"]
    counts = {side: np.zeros(n, np.int64) for side in ("negative", "positive")}
    for side, array in counts.items():
        for b, c in histogram[side].items():
            array[int(b)] += c
    labels = np.repeat(np.r_[np.zeros(n, np.int8), np.ones(n, np.int8)], np.r_[counts["negative"], counts["positive"]])
    scores = np.repeat(
        np.r_[np.arange(n), np.arange(n)].astype(np.float64), np.r_[counts["negative"], counts["positive"]]
    )
    return roc_auc(labels, scores), average_precision(labels, scores)


# Latency histograms, so that shard reports merge into the percentiles one client would have measured:
# bucket b holds latencies in (FLOOR * GROWTH^(b-1), FLOOR * GROWTH^b] ms, so a bucket's upper edge is at most
# 2 % above any latency in it.
LATENCY_FLOOR_MS, LATENCY_GROWTH = 0.001, 1.02


def latency_histogram(latencies_ms: np.ndarray) -> dict:
    ms = np.maximum(np.asarray(latencies_ms, np.float64), LATENCY_FLOOR_MS)
    buckets = np.ceil(np.log(ms / LATENCY_FLOOR_MS) / np.log(LATENCY_GROWTH) - 1e-9).astype(np.int64)
    return {"floor_ms": LATENCY_FLOOR_MS, "growth": LATENCY_GROWTH, "counts": _sparse_counts(buckets)}


def percentiles_from_histogram(histogram: dict, quantiles=(50, 90, 99)) -> list[float]:
    """Nearest-rank percentiles as bucket upper edges: never below the exact value, at most 2 % above it."""
    buckets = sorted((int(b), c) for b, c in histogram["counts"].items())
    edges = np.array([histogram["floor_ms"] * histogram["growth"] ** b for b, _ in buckets])
    cumulative = np.cumsum([c for _, c in buckets])
    if not len(cumulative):
        return [0.0 for _ in quantiles]
    ranks = [max(1, int(np.ceil(q / 100 * cumulative[-1]))) for q in quantiles]
    return [float(edges[np.searchsorted(cumulative, rank)]) for rank in ranks]


def latency_percentiles(latencies: list[float]) -> dict:
    """p50/p90/p99/max/mean in milliseconds of latencies in seconds (zeros when there are none)."""
    ms = np.asarray(latencies, np.float64) * 1000 if latencies else np.zeros(1)
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "max": float(ms.max()), "mean": float(ms.mean())}
