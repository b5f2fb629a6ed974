"""`trainserve load`: the served model's capacity, swept over concurrency (closed loop) and request rate
(open loop, Poisson arrivals) for each batch size, each point measured until stable (measure.py).

Wait for the model -> read its signature -> build the requests (held-out data through the eval's plan,
so that answers are checked against labels as they arrive; or synthetic inputs from the signature's
dtypes and shapes) before any Predict -> one point after another, all pinned to the version the target names
(the one behind --label as GetModelMetadata resolves it, else --version, else the newest AVAILABLE) -> the
report (report.py): the best throughput within the latency budget.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from trainserve.client import ServingClient, Signature, Target
from trainserve.client.predict import predict_request
from trainserve.errors import TrainserveError
from trainserve.evaluation.data import open_eval_data
from trainserve.evaluation.load.config import LoadConfig
from trainserve.evaluation.load.measure import Load, Point, Request, measure
from trainserve.evaluation.load.report import build_load_report, point_line
from trainserve.evaluation.metrics import task_metrics
from trainserve.evaluation.plan import Plan, plan_requests, with_class_ids
from trainserve.protos import predict_pb2
from trainserve.tensors import from_tensor_proto

log = logging.getLogger(__name__)

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


def run_sweep(config: LoadConfig) -> LoadResult:
    """The whole sweep (or, with --during, one load around a command: during.py); raises TrainserveError with a
    one-line message on bad input, before any Predict."""
    config.check()
    if config.during is not None:
        from trainserve.evaluation.load.during import run_during

        return run_during(config)
    target = Target(config.model, config.version, config.label, config.signature)
    client = ServingClient(config.server, tls=config.tls, timeout=config.timeout)
    try:
        version = client.wait_until_available(target, config.wait)  # the version every point pins
        signature = client.signature(target, version)
        inputs = build_inputs(config, client, signature, target, version)
        call = client.channel.unary_unary(PREDICT_METHOD)  # bytes in, bytes out: pre-serialized requests
        points = [
            _measure_point(config, call, inputs, mode, value, batch_size)
            for batch_size in config.batch_sizes
            for mode, values in (("concurrency", config.concurrencies), ("rate", config.rates))
            for value in values
        ]
    finally:
        client.close()
    report = build_load_report(config, version, inputs.data_name, points)
    return LoadResult(report, config.latency_budget_ms is None or report["best"] is not None)


def _measure_point(config: LoadConfig, call, inputs: Inputs, mode: str, value: float, batch_size: int) -> Point:
    load = Load(call, inputs.requests[batch_size], config.timeout, seed=config.seed)
    if mode == "concurrency":
        load.concurrency = int(value)
    else:
        load.rate = value
    measured = measure(load, inputs.plan is not None, config.window_s, config.max_windows, config.stability_latency)
    point = Point(mode, value, batch_size, config.window_s, measured, inputs.check(measured.answers))
    log.info("%s", point_line(point))
    return point


def build_inputs(
    config: LoadConfig, client: ServingClient, signature: Signature, target: Target, version: int
) -> Inputs:
    """Every request the sweep will send, serialized once; bad data or flags fail here, before any Predict."""
    where = f"signature {target.signature!r} of {target.describe()}"
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
                _request(target, version, *synthetic_inputs(signature, b, config.fill, rng, where), None, None)
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
            _request(target, version, plan.request_inputs(columns), len(labels), labels, plan.output_filter)
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


def _request(target: Target, version: int, inputs: dict, examples: int, labels, outputs: list[str] | None) -> Request:
    return Request(predict_request(target, inputs, outputs, version).SerializeToString(), examples, labels)
