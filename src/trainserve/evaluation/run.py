"""Batched evaluation of a served model over gRPC: accuracy, loss, latency and throughput together.

Wait for the model -> read its signature -> check the data against it (before any Predict) -> the
first batch alone pins the version -> the rest with up to `concurrency` requests in flight ->
metrics, each example counted exactly once.
"""

from __future__ import annotations

import logging
import resource
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import numpy as np

from trainserve.errors import TrainserveError
from trainserve.evaluation.client import ServingClient, Signature, Target
from trainserve.evaluation.config import EvalConfig
from trainserve.evaluation.data import EvalData, open_eval_data
from trainserve.evaluation.report import build_report
from trainserve.savedmodel import LoadedModel

log = logging.getLogger(__name__)


@dataclass
class Plan:
    """How the data maps onto the signature; settled before the first Predict."""

    input_name: str
    probabilities: str
    classes: str | None  # None: the signature has no integer `classes` output; take the argmax
    num_classes: int

    @property
    def output_filter(self) -> list[str]:
        return [self.probabilities] + ([self.classes] if self.classes else [])

    def predicted_classes(self, outputs: dict[str, np.ndarray]) -> np.ndarray:
        return outputs[self.classes] if self.classes else outputs[self.probabilities].argmax(axis=1)


def plan_requests(signature: Signature, data: EvalData, target: Target) -> Plan:
    """Check data against the signature: one image input of the right dtype/shape, enough classes."""
    where = f"signature {target.signature!r} of {target.describe()}"
    if len(signature.inputs) != 1:
        raise TrainserveError(f"{where} has inputs {sorted(signature.inputs)}: expected one image input")
    ((name, spec),) = signature.inputs.items()
    if spec.dtype != data.dtype:
        raise TrainserveError(f"{where} wants {name!r} as {spec.dtype.name}; the data is {data.dtype.name}")
    sample = np.zeros((1, *data.shape), data.dtype)
    if not spec.accepts(sample):
        raise TrainserveError(
            f"{where} wants {name!r} shaped {spec.describe()}; the data's images are {list(data.shape)}"
        )
    float_outputs = {
        k: s for k, s in signature.outputs.items() if s.dtype.kind == "f" and s.shape and len(s.shape) == 2
    }
    probabilities = "probabilities" if "probabilities" in float_outputs else None
    if probabilities is None and len(float_outputs) == 1:
        probabilities = next(iter(float_outputs))
    if probabilities is None:
        raise TrainserveError(
            f"{where} has outputs {sorted(signature.outputs)}: expected a float [N, K] 'probabilities'"
        )
    classes_spec = signature.outputs.get("classes")
    classes = "classes" if classes_spec is not None and classes_spec.dtype.kind in "iu" else None
    num_classes = signature.outputs[probabilities].shape[-1]
    if num_classes is None:
        raise TrainserveError(f"{where}: output {probabilities!r} has no fixed class count: expected [N, K]")
    if data.max_label >= num_classes:
        raise TrainserveError(
            f"the data has label {data.max_label} but {where} outputs {num_classes} classes: "
            f"expected labels < {num_classes}"
        )
    if data.label_names and len(data.label_names) != num_classes:
        raise TrainserveError(
            f"the data names {len(data.label_names)} classes but {where} outputs {num_classes}: expected the same"
        )
    return Plan(name, probabilities, classes, num_classes)


@dataclass(frozen=True)
class LocalComparison:
    """One batch's served answer against the same SavedModel run in-process (--compare-local)."""

    max_abs_diff: float  # largest |served - local| probability
    agreeing: int  # examples whose served and local classes match


@dataclass(frozen=True)
class BatchAnswer:
    """The server's answer to one batch, with the batch's true labels."""

    version: int
    labels: np.ndarray
    probabilities: np.ndarray
    classes: np.ndarray  # int64, one per example
    latency_s: float
    retries: int
    local: LocalComparison | None  # None without --compare-local


@dataclass
class Tally:
    """Running totals; each batch is added once, whatever order the answers come in."""

    num_classes: int
    top_k: int
    examples: int = 0
    correct: int = 0
    top_k_hits: int = 0
    loss_sum: float = 0.0
    requests: int = 0
    retries: int = 0
    latencies: list[float] = field(default_factory=list)
    confusion: np.ndarray = field(init=False)
    local_max_abs_diff: float = 0.0
    local_agree: int = 0

    def __post_init__(self):
        self.confusion = np.zeros((self.num_classes, self.num_classes), np.int64)

    def add(self, answer: BatchAnswer) -> None:
        labels, probabilities, classes = answer.labels, answer.probabilities, answer.classes
        if probabilities.shape != (len(labels), self.num_classes):
            raise TrainserveError(
                f"server answered probabilities shaped {list(probabilities.shape)}: "
                f"expected [{len(labels)}, {self.num_classes}]"
            )
        self.examples += len(labels)
        self.correct += int(np.sum(classes == labels))
        k = min(self.top_k, self.num_classes)
        top = np.argpartition(-probabilities, k - 1, axis=1)[:, :k]
        self.top_k_hits += int(np.sum(np.any(top == labels[:, None], axis=1)))
        picked = probabilities[np.arange(len(labels)), labels].astype(np.float64)
        self.loss_sum += float(-np.sum(np.log(np.clip(picked, 1e-7, 1.0))))
        np.add.at(self.confusion, (labels, classes), 1)
        self.requests += 1
        self.retries += answer.retries
        self.latencies.append(answer.latency_s)
        if answer.local is not None:
            self.local_max_abs_diff = max(self.local_max_abs_diff, answer.local.max_abs_diff)
            self.local_agree += answer.local.agreeing


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


@dataclass
class EvalResult:
    report: dict
    passed: bool
    latencies_ms: list[float]


def evaluate(config: EvalConfig, progress: bool | None = None) -> EvalResult:
    """Run the whole evaluation; raises TrainserveError with a one-line message on any failure."""
    config.check()
    start_rss = _current_rss_mb()
    data = open_eval_data(config.data, config.limit, config.synthetic)
    target = Target(config.model, config.version, config.label, config.signature)
    client = ServingClient(config.server, _max_message_bytes(config, data), config.tls_ca, config.timeout)
    try:
        client.wait_until_available(target, config.wait)
        signature = client.signature(target, None)
        plan = plan_requests(signature, data, target)
        local_model = LoadedModel(config.compare_local) if config.compare_local is not None else None
        log.info(
            "evaluating %s on %s: %d examples of %s, batches of %d, %d in flight",
            target.describe(), config.server, data.count, data.name, config.batch_size, config.concurrency,
        )  # fmt: skip
        predictor = _BatchPredictor(client, target, plan, config.retries, local_model)
        totals = _run_batches(predictor, data, config, progress)
    finally:
        client.close()
    report = build_report(FinishedRun(config, data, plan, totals, start_rss, _peak_rss_mb()))
    passed = config.min_accuracy is None or report["metrics"]["accuracy"] >= config.min_accuracy
    report["passed"] = passed
    return EvalResult(report, passed, [t * 1000 for t in totals.tally.latencies])


def _max_message_bytes(config: EvalConfig, data: EvalData) -> int:
    """Room for a request of `batch_size` images (and its answer), at least 4 MiB, at most INT32_MAX,
    the largest message gRPC and TF Serving accept."""
    image_bytes = int(np.prod(data.shape)) * data.dtype.itemsize
    return min(2**31 - 1, max(4 << 20, 2 * config.batch_size * max(image_bytes, 16 * 1024) + (1 << 20)))


def _current_rss_mb() -> float:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * resource.getpagesize() / 2**20
    except OSError:
        return 0.0


def _peak_rss_mb() -> float:
    """VmHWM: this process's peak RSS. (ru_maxrss survives exec, so it can report a parent's peak.)"""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass(frozen=True)
class _BatchPredictor:
    """Sends one batch and turns the answer into a BatchAnswer; called from the worker threads."""

    client: ServingClient
    target: Target
    plan: Plan
    retries: int
    local_model: LoadedModel | None

    def predict(self, x: np.ndarray, y: np.ndarray, version: int | None) -> BatchAnswer:
        inputs = {self.plan.input_name: x}
        prediction = self.client.predict(self.target, inputs, self.plan.output_filter, version, self.retries)
        probabilities = prediction.outputs[self.plan.probabilities]
        classes = self.plan.predicted_classes(prediction.outputs)
        local = None
        if self.local_model is not None:
            mine = self.local_model.run(self.target.signature, inputs, self.plan.output_filter)
            local = LocalComparison(
                float(np.max(np.abs(mine[self.plan.probabilities] - probabilities), initial=0.0)),
                int(np.sum(self.plan.predicted_classes(mine) == classes)),
            )
        return BatchAnswer(
            version=prediction.version,
            labels=y,
            probabilities=probabilities,
            classes=classes.astype(np.int64),
            latency_s=prediction.latency_s,
            retries=prediction.retries,
            local=local,
        )


def _run_batches(predictor: _BatchPredictor, data: EvalData, config: EvalConfig, progress: bool | None) -> RunTotals:
    """The first batch alone, then the rest concurrently, all pinned to the version that answered the first."""
    from tqdm import tqdm

    tally = Tally(predictor.plan.num_classes, config.top_k)
    pinned: int | None = None
    show = sys.stderr.isatty() if progress is None else progress
    bar = tqdm(total=data.count, unit="ex", disable=not show, desc=f"eval {predictor.target.model}")

    def record(answer: BatchAnswer) -> None:
        # Pinned requests name the version, so a different one means a server that ignored the pin.
        if pinned is not None and answer.version != pinned:
            raise TrainserveError(f"server answered version {answer.version} after pinning version {pinned}")
        tally.add(answer)
        bar.update(len(answer.labels))

    batches = data.batches(config.batch_size)
    started = time.perf_counter()
    try:
        first = next(batches, None)
        if first is not None:
            # Alone: a version published mid-run must not mix into the metrics, so its answer pins the rest.
            answer = predictor.predict(*first, version=None)
            pinned = answer.version
            record(answer)
            _predict_concurrently(lambda x, y: predictor.predict(x, y, pinned), batches, config.concurrency, record)
    finally:
        bar.close()
    return RunTotals(tally, pinned, time.perf_counter() - started)


def _predict_concurrently(
    predict: Callable[[np.ndarray, np.ndarray], BatchAnswer],
    batches: Iterator[tuple[np.ndarray, np.ndarray]],
    concurrency: int,
    record: Callable[[BatchAnswer], None],
) -> None:
    """Keep up to `concurrency` batches in flight; `record` each answer in this thread as it arrives."""
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="eval") as pool:
        in_flight: set[Future] = set()
        try:
            for x, y in batches:
                if len(in_flight) >= concurrency:
                    done, in_flight = wait(in_flight, return_when=FIRST_COMPLETED)
                    for future in done:
                        record(future.result())
                in_flight.add(pool.submit(predict, x, y))
            for future in in_flight:
                record(future.result())
        except BaseException:
            for future in in_flight:  # a failure ends the run: send nothing that has not started
                future.cancel()
            raise
