"""What a load sends, built once before the first Predict: the requests for each batch size (held-out data through
the eval's plan, so that answers are checked against labels; or synthetic inputs from the signature's dtypes and
shapes), each pinned to the version the target names; and the result a load command returns."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainserve.client import ServingClient, Signature, Target
from trainserve.client.predict import predict_request
from trainserve.errors import TrainserveError
from trainserve.evaluation.data import open_eval_data
from trainserve.evaluation.load.config import LoadConfig
from trainserve.evaluation.load.measure import Request
from trainserve.evaluation.metrics import task_metrics
from trainserve.evaluation.plan import Plan, plan_requests, with_class_ids
from trainserve.protos import predict_pb2
from trainserve.tensors import from_tensor_proto

PREDICT_METHOD = "/tensorflow.serving.PredictionService/Predict"
SYNTHETIC_REQUESTS = 8  # distinct synthetic requests per batch size, sent in turn


@dataclass(frozen=True)
class Inputs:
    """What every point sends: requests by batch size, and how answers are checked (None: synthetic)."""

    requests: dict[int, list[Request]]
    plan: Plan | None
    data_name: str  # "synthetic (from the signature)" or the data's name

    def check(self, answers: list[tuple[Request, bytes]]):
        """The answers checked against their requests' labels: the task's metrics (None: nothing to check)."""
        if self.plan is None or not answers:
            return None
        plan, quality = self.plan, task_metrics(self.plan.task, 1)
        labels, scores, classes = [], [], []
        for request, answer in answers:
            outputs = predict_pb2.PredictResponse.FromString(answer).outputs
            labels.append(request.labels)
            scores.append(from_tensor_proto(outputs[plan.output]))
            if plan.classes_output:
                classes.append(from_tensor_proto(outputs[plan.classes_output]).reshape(-1))
        joined_classes = np.concatenate(classes) if classes else None
        quality.add(np.concatenate(labels), np.concatenate(scores), plan.output, joined_classes)
        return quality


@dataclass
class LoadResult:
    report: dict
    passed: bool  # False when a --latency-budget-ms was given and no point met it


def build_inputs(
    config: LoadConfig, client: ServingClient, signature: Signature, target: Target, version: int
) -> Inputs:
    """Every request the sweep will send, serialized once; bad data or flags fail here, before any Predict."""
    where = f"signature {target.signature!r} of {target.describe()}"
    asked = version if config.pin_version else None  # unpinned: the label (or no version), as a client asks
    if config.data is None:
        rng = np.random.default_rng(config.seed)
        unknown = sorted(set(config.fill) - set(signature.inputs))
        if unknown:
            raise TrainserveError(
                f"--fill {', '.join(unknown)}: {where} has no such input: expected one of "
                f"{', '.join(sorted(signature.inputs))}"
            )
        requests = {
            b: [
                _request(target, asked, *synthetic_inputs(signature, b, config.fill, rng, where), None, None)
                for _ in range(SYNTHETIC_REQUESTS)
            ]
            for b in config.batch_sizes
        }
        return Inputs(requests, None, "synthetic (from the signature)")
    data = open_eval_data(config.data, max(config.limit, *config.batch_sizes), None, config.label_column)
    data = with_class_ids(client, target, signature, data, config.input_map, retries=0, version=version)
    plan, data = plan_requests(signature, data, target, config.task, config.output, config.input_map)
    requests = {}
    for b in config.batch_sizes:
        requests[b] = [
            _request(target, asked, plan.request_inputs(columns), len(labels), labels, plan.output_filter)
            for columns, labels in data.batches(b)
            if len(labels) == b  # full batches only: every request of a point carries `b` examples
        ]
        if not requests[b]:
            raise TrainserveError(
                f"--batch-sizes {b}: {data.name} has {data.count} examples: expected at least {b} (one full batch)"
            )
    return Inputs(requests, plan, data.name)


def synthetic_inputs(
    signature: Signature,
    batch_size: int,
    fill: dict[str, float],
    rng: np.random.Generator,
    where: str = "the signature",
) -> tuple[dict[str, np.ndarray], int]:
    """Inputs of the signature's dtypes and shapes (the first unknown dimension -> the batch size, any other
    -> 1), random unless `fill` names a value; and the examples one request carries."""
    arrays, examples = {}, 1
    for name, spec in signature.inputs.items():
        dims = (None,) if spec.shape is None else spec.shape
        shape = tuple((batch_size if i == 0 else 1) if d is None else d for i, d in enumerate(dims))
        if dims and dims[0] is None:
            examples = batch_size
        if spec.dtype.kind not in "biuf":
            raise TrainserveError(
                f"input {name!r} of {where} is {spec.dtype.name}: synthetic inputs are "
                "numbers or booleans: expected --data"
            )
        if name in fill:
            arrays[name] = np.full(shape, fill[name], spec.dtype)
        elif spec.dtype.kind == "f":
            arrays[name] = rng.random(shape).astype(spec.dtype)
        elif spec.dtype.kind == "b":
            arrays[name] = rng.random(shape) < 0.5
        else:  # uint8 like an image; other integers small, so that ids stay in range
            arrays[name] = rng.integers(0, 256 if spec.dtype == np.uint8 else 2, shape).astype(spec.dtype)
    return arrays, examples


def _request(
    target: Target, version: int | None, inputs: dict, examples: int, labels, outputs: list[str] | None
) -> Request:
    return Request(predict_request(target, inputs, outputs, version).SerializeToString(), examples, labels)
