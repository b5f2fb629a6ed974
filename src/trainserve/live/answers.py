"""What a captured record holds for the join: its answers (a classifier's probabilities, a regression model's
predictions), a request input as one slice value per example, and the paired error differences of two regression
versions. One error line when a record is not what the model's task needs."""

from __future__ import annotations

import numpy as np

from trainserve.errors import TrainserveError
from trainserve.layout import PREDICTIONS, PROBABILITIES
from trainserve.live.tally import SUMS, power_sums
from trainserve.tensors import from_tensor_proto
from trainserve.traffic.reader import CapturedRequest


def error_pair(first: int, second: int, a: np.ndarray, b: np.ndarray) -> dict:
    """Paired differences of two versions' squared and absolute errors on the examples both answered."""
    differences = {"squared_error": a - b, "absolute_error": np.sqrt(a) - np.sqrt(b)}
    return {
        "versions": [first, second],
        "examples": len(a),
        "first_only": 0,
        "second_only": 0,
        "both_right": 0,
        "differences": {kind: dict(zip(SUMS, power_sums(d))) for kind, d in differences.items()},
    }


def width(record: CapturedRequest) -> int:
    """The width of the first answer: its probabilities, or 1 for a regression model's predictions."""
    if PROBABILITIES not in record.response.outputs and PREDICTIONS in record.response.outputs:
        return 1
    return probabilities(record).shape[1]


def predictions(record: CapturedRequest) -> np.ndarray:
    """A regression answer: one number per example."""
    outputs = record.response.outputs
    if PREDICTIONS not in outputs:
        raise TrainserveError(
            f"request {record.request_id!r} (version {record.version}) was answered with outputs "
            f"{', '.join(sorted(outputs)) or 'none'}: expected {PREDICTIONS!r} (a regression model's answer)"
        )
    values = from_tensor_proto(outputs[PREDICTIONS]).astype(np.float64)
    if values.ndim > 2 or (values.ndim == 2 and values.shape[1] != 1):
        raise TrainserveError(
            f"request {record.request_id!r} (version {record.version}) answered {PREDICTIONS!r} shaped "
            f"{list(values.shape)}: expected one number per example ([N] or [N, 1])"
        )
    return values.reshape(-1)


def probabilities(record: CapturedRequest) -> np.ndarray:
    outputs = record.response.outputs
    if PROBABILITIES not in outputs:
        raise TrainserveError(
            f"request {record.request_id!r} (version {record.version}) was answered with outputs "
            f"{', '.join(sorted(outputs)) or 'none'}: expected {PROBABILITIES!r} (a classification model's answer)"
        )
    scores = from_tensor_proto(outputs[PROBABILITIES])
    return scores.reshape(len(scores), -1) if scores.ndim else scores.reshape(1, -1)


def input_values(record: CapturedRequest, name: str, n: int) -> np.ndarray:
    """The request input `name`, one text value per example; one error line when it is not that."""
    if name not in record.request.inputs:
        raise TrainserveError(
            f"--slice {name}: neither a labels-file column nor an input of request {record.request_id!r} "
            f"(inputs: {', '.join(sorted(record.request.inputs))})"
        )
    array = from_tensor_proto(record.request.inputs[name])
    array = array.reshape(1) if array.ndim == 0 else array
    if array.size != n:
        raise TrainserveError(
            f"--slice {name}: input shaped {list(array.shape)} in request {record.request_id!r}: expected one value "
            f"per example ({n})"
        )
    flat = array.reshape(n)
    return np.array([v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in flat], dtype=object)
