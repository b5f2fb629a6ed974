"""A shadow copy's answer against stable's, per example (the first dimension of the outputs).

Only the outputs both versions have are compared, and of those only the ones of the same shape and the same numeric
or bool dtype: a candidate that adds or drops an output, or answers another shape in one of them, is still compared
on the rest. Answers with no such output in common are `Incomparable` (their own outcome, not the candidate's
error). The classification outputs, where an example flips when its predicted class differs:

- float `[N, K]`, K > 1: scores or probabilities, the class is the argmax;
- integer or bool `[N]` or `[N, 1]`: class ids (e.g. `classes`), the class is the value;
- float `[N, 1]` named as a binary classifier's head names it (`probabilities`, TF's `logistic`): a sigmoid, the
  class is whether it is above 0.5.

A float output named `predictions` (the regression head's name in the signature, as replay reads it) is never a
classification, nor is any other float `[N, 1]`: a regression model's one target is not a sigmoid, and its shape
alone cannot tell. Every comparable output that is not a classification (regression) adds |candidate - stable|
summed over its elements.

Per example, too: stable's class (of the first classification output, by name) with whether it flipped, the rows
of the flip matrix a check per class reads; and, given a `tolerance` (the route's `shadow_tolerance`), whether any
regression element differs from stable's by more than it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np

from trainserve.errors import TrainserveError
from trainserve.layout import PREDICTIONS, PROBABILITIES
from trainserve.protos import predict_pb2
from trainserve.tensors import from_tensor_proto

SIGMOID_THRESHOLD = 0.5
SIGMOID_OUTPUTS = (PROBABILITIES, "logistic")  # a binary classifier's one score, by the names heads give it
# Stable's classes counted each under its own label (0 .. CLASS_LABELS - 1); the rest under OTHER_CLASS. Fixed, not
# the top classes by count: a class's series never moves to another label mid-step, every replica labels alike,
# and the page holds at most 2 x (CLASS_LABELS + 1) such series per candidate.
CLASS_LABELS = 16
OTHER_CLASS = "other"


class Incomparable(ValueError):
    """Two answers with no comparable output in common, or whose outputs disagree on the number of examples."""


@dataclass(frozen=True)
class Comparison:
    """One pair of answers: examples compared; of them, those compared on at least one classification output
    (`classified`: `pairs` or 0) and those whose class flipped in any; |candidate - stable| summed (regression).
    By stable's class label (class_label): the classified examples and the flips; with a tolerance, the examples
    compared on a regression output against it (`tolerated`: `pairs` or 0) and those beyond it."""

    pairs: int
    classified: int
    flips: int
    abs_diff: float
    class_pairs: Counter = field(default_factory=Counter)
    class_flips: Counter = field(default_factory=Counter)
    tolerated: int = 0
    beyond: int = 0


def class_label(value) -> str:
    """A class's label on the proxy's page: its id below CLASS_LABELS, else OTHER_CLASS (a sigmoid's: 0 or 1)."""
    number = int(value)
    return str(number) if 0 <= number < CLASS_LABELS else OTHER_CLASS


def predicted_class(x: np.ndarray, name: str = "") -> np.ndarray | None:
    """Each example's class if output `name` is a classification output (see the module's docstring), else None."""
    floating, integral = np.issubdtype(x.dtype, np.floating), np.issubdtype(x.dtype, np.integer) or x.dtype == bool
    if floating and (name == PREDICTIONS or x.ndim != 2):
        return None
    if floating and x.shape[1] > 1:
        return x.argmax(axis=1)
    if integral and (x.ndim == 1 or (x.ndim == 2 and x.shape[1] == 1)):
        return x.reshape(len(x))
    if floating and name in SIGMOID_OUTPUTS:
        return x[:, 0] > SIGMOID_THRESHOLD
    return None


def comparable_outputs(stable, candidate) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(name, stable's, candidate's) for each output both have with one shape and one numeric or bool dtype."""
    out = []
    for key in sorted(set(stable) & set(candidate)):
        try:
            x, y = from_tensor_proto(stable[key]), from_tensor_proto(candidate[key])
        except TrainserveError:  # a dtype without numbers (strings) or one numpy lacks: not comparable
            continue
        if x.shape == y.shape and x.dtype == y.dtype != object and x.ndim > 0:
            out.append((key, x, y))
    return out


def compare(stable: bytes, candidate: bytes, tolerance: float | None = None) -> Comparison:
    """Two serialized PredictResponses to the same request, compared (see the module's docstring)."""
    a, b = (predict_pb2.PredictResponse.FromString(r).outputs for r in (stable, candidate))
    outputs = comparable_outputs(a, b)
    if not outputs:
        raise Incomparable(f"no comparable output in common: {sorted(a)} against {sorted(b)}")
    rows = {key: x.shape[0] for key, x, _ in outputs}
    if len(set(rows.values())) > 1:
        raise Incomparable(f"outputs disagree on the number of examples: {rows}")
    (n,) = set(rows.values())
    flipped, classes, abs_diff = np.zeros(n, bool), None, 0.0
    largest = None  # per example, the largest |difference| of a regression element
    for key, x, y in outputs:
        x_class, y_class = predicted_class(x, key), predicted_class(y, key)
        if x_class is not None:
            flipped |= x_class != y_class
            classes = x_class if classes is None else classes
            continue
        difference = np.abs(y.astype(np.float64) - x.astype(np.float64))
        abs_diff += float(difference.sum())
        per_example = difference.reshape(n, -1) if difference.size else np.zeros((n, 1))
        most = per_example.max(axis=1) if per_example.shape[1] else np.zeros(n)
        largest = most if largest is None else np.maximum(largest, most)
    found = Comparison(n, 0 if classes is None else n, int(flipped.sum()), abs_diff)
    if classes is not None:
        labels = [class_label(c) for c in classes]
        found.class_pairs.update(labels)
        found.class_flips.update(label for label, f in zip(labels, flipped) if f)
    if tolerance is not None and largest is not None:
        return _with_tolerance(found, int(np.sum(largest > tolerance)))
    return found


def _with_tolerance(found: Comparison, beyond: int) -> Comparison:
    return replace(found, tolerated=found.pairs, beyond=beyond)
