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
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import numpy as np

from trainserve.errors import TrainserveError
from trainserve.evaluation.client import ServingClient, Signature, Target
from trainserve.evaluation.config import EvalConfig
from trainserve.evaluation.data import EvalData, open_eval_data

log = logging.getLogger(__name__)


@dataclass
class Plan:
    """How the data maps onto the signature; settled before the first Predict."""

    input_name: str
    probabilities: str
    classes: str | None
    num_classes: int


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

    def add(self, labels: np.ndarray, probabilities: np.ndarray, classes: np.ndarray, latency: float, retries: int):
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
        self.retries += retries
        self.latencies.append(latency)


@dataclass
class EvalResult:
    report: dict
    passed: bool
    latencies_ms: list[float]


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * resource.getpagesize() / 2**20
    except OSError:
        return 0.0


def evaluate(config: EvalConfig, progress: bool | None = None) -> EvalResult:
    """Run the whole evaluation; raises TrainserveError with a one-line message on any failure."""
    from trainserve.evaluation.report import build_report

    config.check()
    start_rss = _rss_mb()
    data = open_eval_data(config.data, config.limit, config.synthetic)
    target = Target(config.model, config.version, config.label, config.signature)
    image_bytes = int(np.prod(data.shape)) * data.dtype.itemsize
    max_message = min(2**31 - 1, max(4 << 20, 2 * config.batch_size * max(image_bytes, 16 * 1024) + (1 << 20)))
    client = ServingClient(config.server, max_message, config.tls_ca, config.timeout)
    local = None
    try:
        client.wait_until_available(target, config.wait)
        signature = client.signature(target, None)
        plan = plan_requests(signature, data, target)
        if config.compare_local is not None:
            from trainserve.savedmodel import LoadedModel

            local = LoadedModel(config.compare_local)
        log.info(
            "evaluating %s on %s: %d examples of %s, batches of %d, %d in flight",
            target.describe(), config.server, data.count, data.name, config.batch_size, config.concurrency,
        )  # fmt: skip
        tally, pinned, wall = _run(client, target, plan, data, config, local, progress)
    finally:
        client.close()
    report = build_report(config, data, plan, tally, pinned, wall, start_rss, _peak_rss_mb())
    passed = config.min_accuracy is None or report["metrics"]["accuracy"] >= config.min_accuracy
    report["passed"] = passed
    return EvalResult(report, passed, [t * 1000 for t in tally.latencies])


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


def _run(client, target, plan, data, config, local, progress):
    outputs = [plan.probabilities] + ([plan.classes] if plan.classes else [])
    tally = Tally(plan.num_classes, config.top_k)
    pinned: list[int] = []

    def one(x: np.ndarray, y: np.ndarray):
        version, answer, latency, retries = client.predict(
            target, {plan.input_name: x}, outputs, pinned[0] if pinned else None, config.retries
        )
        probabilities = answer[plan.probabilities]
        classes = answer[plan.classes] if plan.classes else probabilities.argmax(axis=1)
        compared = None
        if local is not None:
            mine = local.run(target.signature, {plan.input_name: x}, outputs)
            compared = (
                float(np.max(np.abs(mine[plan.probabilities] - probabilities), initial=0.0)),
                int(np.sum((mine[plan.classes] if plan.classes else mine[plan.probabilities].argmax(1)) == classes)),
            )
        return version, y, probabilities, classes.astype(np.int64), latency, retries, compared

    def record(result):
        version, y, probabilities, classes, latency, retries, compared = result
        if pinned and version != pinned[0]:
            raise TrainserveError(f"server answered version {version} after pinning version {pinned[0]}")
        tally.add(y, probabilities, classes, latency, retries)
        if compared is not None:
            tally.local_max_abs_diff = max(tally.local_max_abs_diff, compared[0])
            tally.local_agree += compared[1]
        bar.update(len(y))

    from tqdm import tqdm

    show = sys.stderr.isatty() if progress is None else progress
    bar = tqdm(total=data.count, unit="ex", disable=not show, desc=f"eval {target.model}")
    batches = data.batches(config.batch_size)
    started = time.perf_counter()
    try:
        first = next(batches, None)
        if first is not None:
            result = one(*first)  # alone: its answer pins the version for every later request
            pinned.append(result[0])
            record(result)
        with ThreadPoolExecutor(max_workers=config.concurrency, thread_name_prefix="eval") as pool:
            pending: set[Future] = set()
            try:
                for x, y in batches:
                    if len(pending) >= config.concurrency:
                        done, pending = wait(pending, return_when=FIRST_COMPLETED)
                        for future in done:
                            record(future.result())
                    pending.add(pool.submit(one, x, y))
                for future in pending:
                    record(future.result())
            except BaseException:
                for future in pending:
                    future.cancel()
                raise
    finally:
        bar.close()
    return tally, (pinned[0] if pinned else None), time.perf_counter() - started
