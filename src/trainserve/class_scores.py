"""How a classifier's answer reads, for eval and live-eval alike: probabilities or logits (decided from the
scores), natural-log class probabilities from either, and precision/recall/F1 per class from a confusion matrix."""

from __future__ import annotations

from typing import Literal

import numpy as np

from trainserve.errors import TrainserveError

OutputKind = Literal["probabilities", "logits"]
SUM_TOLERANCE = 1e-3  # float32 softmax rows sum to 1 within ~1e-6; a logit row misses by far more
PROBABILITY_FLOOR = 1e-7  # the loss clips probabilities here, as Keras' cross-entropy does


def output_kind(scores: np.ndarray, output: str) -> OutputKind:
    """Probabilities (rows in [0, 1] summing to 1; one column in [0, 1]) or logits (anything outside [0, 1])."""
    in_unit = bool(np.all((scores >= 0) & (scores <= 1)))
    if not in_unit:
        return "logits"
    if scores.shape[1] == 1 or np.allclose(scores.sum(axis=1), 1.0, atol=SUM_TOLERANCE):
        return "probabilities"
    raise TrainserveError(
        f"output {output!r} rows lie in [0, 1] but do not sum to 1 (first row sums to {scores[0].sum():.4f}): "
        "expected probabilities or logits of one label per example (independent sigmoids are multi-label)"
    )


def log_probabilities(scores: np.ndarray, kind: OutputKind) -> np.ndarray:
    """[N, K] natural-log class probabilities (K >= 2) from [N, K] or [N, 1] scores of either kind."""
    scores = scores.astype(np.float64)
    if scores.shape[1] == 1:  # one score: class 1's probability (or logit); class 0 gets the rest
        z = scores[:, 0]
        if kind == "logits":  # log sigmoid(z), log(1 - sigmoid(z)) without overflow
            return np.stack([-np.logaddexp(0, z), -np.logaddexp(0, -z)], axis=1)
        p = np.clip(z, PROBABILITY_FLOOR, 1 - PROBABILITY_FLOOR)
        return np.log(np.stack([1 - p, p], axis=1))
    if kind == "logits":
        shifted = scores - scores.max(axis=1, keepdims=True)
        return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return np.log(np.clip(scores, PROBABILITY_FLOOR, 1.0))


def per_class(confusion: np.ndarray, label_names: list[str]) -> list[dict]:
    """Precision, recall and F1 per class from the confusion matrix (rows: truth, columns: predicted)."""
    true_pos = np.diag(confusion).astype(np.float64)
    predicted, actual = confusion.sum(axis=0), confusion.sum(axis=1)
    precision = np.divide(true_pos, predicted, out=np.zeros_like(true_pos), where=predicted > 0)
    recall = np.divide(true_pos, actual, out=np.zeros_like(true_pos), where=actual > 0)
    total = precision + recall
    f1 = np.divide(2 * precision * recall, total, out=np.zeros_like(true_pos), where=total > 0)
    names = label_names or [str(i) for i in range(len(confusion))]
    return [
        {"label": names[i], "precision": precision[i], "recall": recall[i], "f1": f1[i], "support": int(actual[i])}
        for i in range(len(confusion))
    ]
