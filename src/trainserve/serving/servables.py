"""What both APIs (gRPC and REST) call: resolve a model spec to a loaded version, check the
request against it, run it, and count it.

Failures are raised as ServingError carrying the gRPC status TF Serving gives them; the gRPC API sends
that code and the REST API maps it to an HTTP status.

Predict has two faces on one path: `predict` blocks (REST's threads) and `predict_async` awaits (the
gRPC event loop), where a request waits for its batch without holding a thread, and a request that
runs alone runs on the executor the front end gives, never on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Executor
from dataclasses import dataclass

import grpc

from trainserve.errors import TrainserveError, first_line
from trainserve.exposition import UNKNOWN_MODEL
from trainserve.layout import DEFAULT_SIGNATURE
from trainserve.protos import get_model_metadata_pb2
from trainserve.savedmodel import LoadedModel, RunError, UnknownSignature
from trainserve.serving.batching import Arrays, BatchScheduler, QueueFull, shape_key, task_size
from trainserve.serving.capture import Capture, ModelCapture
from trainserve.serving.config import Batching
from trainserve.serving.manager import ModelManager, NotFound, ServableHandle, UnknownLabel, VersionState
from trainserve.serving.metrics import ServingMetrics


class ServingError(Exception):
    """A request failure with the gRPC status TF Serving would give it."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


def unknown_signature(signature: str) -> ServingError:
    return ServingError(grpc.StatusCode.FAILED_PRECONDITION, f'Serving signature key "{signature}" not found.')


# request_latency's API label: the RPC's name, as TF Serving records it.
LATENCY_API = {"predict": "Predict", "metadata": "GetModelMetadata", "status": "GetModelStatus"}


# TensorFlow's canonical error codes are gRPC's status codes, number for number.
STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}


@contextlib.contextmanager
def tf_errors(signature: str):
    """A model's failure as the ServingError TF Serving answers with: a TensorFlow error keeps its code
    (TF Serving passes the run's Status through), a request the checks refuse is INVALID_ARGUMENT."""
    try:
        yield
    except ServingError:
        raise
    except UnknownSignature:
        raise unknown_signature(signature) from None
    except RunError as exc:
        raise ServingError(STATUS_CODES.get(exc.code, grpc.StatusCode.UNKNOWN), str(exc)) from None
    except TrainserveError as exc:
        raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
    except Exception as exc:  # not TensorFlow's and not a check's: a fault of the server, not of the request
        raise ServingError(grpc.StatusCode.INTERNAL, first_line(exc)) from None


@contextlib.contextmanager
def unavailable_when_full():
    """A full batch queue answers UNAVAILABLE, as TF Serving's does."""
    try:
        yield
    except QueueFull as exc:
        raise ServingError(grpc.StatusCode.UNAVAILABLE, str(exc)) from None


def check_output_filter(model: LoadedModel, signature: str, output_filter: tuple[str, ...]) -> None:
    _, outputs = model.signature(signature)
    unknown = [k for k in output_filter if k not in outputs]
    if unknown:
        raise TrainserveError(f"output_filter {unknown} not in signature {signature!r}: expected {sorted(outputs)}")


def outcome(exc: BaseException | None) -> str:
    """A finished request's status name, as request_count records it."""
    if exc is None:
        return "OK"
    if isinstance(exc, ServingError):
        return exc.code.name
    if isinstance(exc, asyncio.CancelledError):  # the client left (or its deadline passed) while it waited
        return "CANCELLED"
    return "UNKNOWN"


class Tracked:
    """A request counted while it runs (for the drain log), then by outcome and latency (for metrics), under
    its model's name when that model is configured, else under UNKNOWN_MODEL: a client's typo adds no series.

    A class, not a @contextmanager: it runs on the event loop for every request, where a generator
    object per request is work that can be spared."""

    __slots__ = ("servables", "labels", "started", "version")

    def __init__(self, servables: Servables, name: str, api: str, entrypoint: str):
        self.servables, self.labels = servables, (name, api, entrypoint)
        self.version = ""  # the version that answers, once resolved: the metrics' `version` label

    def __enter__(self) -> Tracked:
        with self.servables._lock:
            self.servables._inflight += 1
        self.started = time.perf_counter()
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        micros = (time.perf_counter() - self.started) * 1e6
        servables, (name, api, entrypoint) = self.servables, self.labels
        with servables._lock:
            servables._inflight -= 1
        name = name if name in servables.manager.models else UNKNOWN_MODEL
        servables.metrics.requests.add(name, self.version, api, outcome(exc))
        servables.metrics.request_latency.observe(micros, name, self.version, LATENCY_API[api], entrypoint)


@dataclass
class PredictCall:
    """A checked Predict, ready to run: alone (`key` None) or in the batch queue `key`."""

    version: int
    signature: str
    run: Callable[[Arrays], Arrays]
    key: Hashable | None = None
    size: int = 0


class Servables:
    """The served models as requests see them, plus the request bookkeeping (in flight, counts)."""

    def __init__(self, manager: ModelManager, batching: Batching | None, capture: Capture | None = None):
        self.manager, self.batching = manager, batching
        self.capture = capture  # logging_config: sampled Predict calls are written (serving/capture.py)
        self.metrics = ServingMetrics()
        self.scheduler = BatchScheduler(batching, self.metrics.record_batch) if batching else None
        if self.scheduler is not None:
            manager.run_warmup = self._warmup_in_batches
        self.stopping = threading.Event()  # set when the drain begins (health answers NOT_SERVING)
        self._inflight = 0
        self._lock = threading.Lock()

    def sample(self, name: str, origin: str | None = None) -> ModelCapture | None:
        """The model's logging when this Predict is sampled (the capture read once: a reload may swap it); a call
        of trainserve's own (`origin`, traffic.origin) is never sampled, only counted."""
        capture = self.capture
        return capture.sample(name, origin) if capture is not None else None

    def resolve(self, name: str, version: int | None, label: str | None) -> ServableHandle:
        try:
            return self.manager.get(name).resolve(version, label)
        except NotFound as exc:
            raise ServingError(grpc.StatusCode.NOT_FOUND, str(exc)) from None
        except UnknownLabel as exc:
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None

    def inputs_spec(self, servable: ServableHandle, signature: str) -> dict:
        """The named signature's inputs (name -> spec) in the resolved version."""
        try:
            inputs_spec, _ = servable.model.signature(signature)
        except UnknownSignature:
            raise unknown_signature(signature) from None
        return inputs_spec

    def predict(self, name, version, label, signature, to_inputs, output_filter=(), entrypoint="REST"):
        """Returns (version, signature name, outputs); blocks until they are computed. `to_inputs` converts
        the request with the resolved version's input specs (REST's JSON takes its signature's dtypes); that version
        is held until the answer, so an unload in between cannot take it away, and every failure is counted."""
        with Tracked(self, name, "predict", entrypoint) as tracked:
            signature = signature or DEFAULT_SIGNATURE
            servable = self.resolve(name, version, label)
            tracked.version = str(servable.version)
            inputs = to_inputs(self.inputs_spec(servable, signature))
            call = self._prepare(servable, signature, inputs, output_filter)
            if call.key is None:
                return call.version, call.signature, call.run(inputs)
            with unavailable_when_full():
                return call.version, call.signature, self.scheduler.submit(call.key, call.run, inputs, call.size)

    async def predict_async(self, name, version, label, signature, inputs, output_filter, executor: Executor):
        """`predict` for an event loop: waits for its batch, or runs alone on `executor`."""
        with Tracked(self, name, "predict", "GRPC") as tracked:
            servable = self.resolve(name, version, label)  # held until the request ends, even across an unload
            tracked.version = str(servable.version)
            call = self._prepare(servable, signature, inputs, output_filter)
            loop = asyncio.get_running_loop()
            if call.key is not None:
                with unavailable_when_full():
                    task = self.scheduler.enqueue(call.key, call.run, inputs, call.size, loop)
                if task is not None:  # None once the drain began: it runs alone
                    return call.version, call.signature, await task.future
            return call.version, call.signature, await loop.run_in_executor(executor, call.run, inputs)

    def _prepare(self, servable: ServableHandle, signature, inputs, output_filter) -> PredictCall:
        """Check the request against the resolved version; with batching, pick the queue it joins."""
        signature = signature or DEFAULT_SIGNATURE
        model, output_filter = servable.model, tuple(output_filter)
        self._check_batch_size(inputs)
        run = functools.partial(self._run, model, signature, output_filter=output_filter)
        size = task_size(inputs) if self.scheduler else None
        if size is None:  # batching off, or a request that cannot be concatenated: it runs alone
            return PredictCall(servable.version, signature, run)
        # Checked before queueing: one malformed request must not fail the batch it would join.
        with tf_errors(signature):
            model.check_inputs(signature, inputs)
            check_output_filter(model, signature, output_filter)
        key = (model, signature, frozenset(output_filter), shape_key(inputs))
        return PredictCall(servable.version, signature, run, key, size)

    def _check_batch_size(self, inputs) -> None:
        """With batching on, a request larger than max_batch_size fails, as in the batch scheduler TF
        Serving uses (tensorflow/core/kernels/batching_util/shared_batch_scheduler.h)."""
        if self.batching is None:
            return
        sizes = {v.shape[0] for v in inputs.values() if v.ndim}
        if sizes and max(sizes) > self.batching.max_batch_size:
            raise ServingError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"Task size {max(sizes)} is larger than maximum input batch size {self.batching.max_batch_size}",
            )

    def _warmup_in_batches(self, loaded: LoadedModel, signature: str, inputs: Arrays) -> Arrays:
        """A warmup record of a version loaded while others serve, on the shared batch threads: TF Serving replays
        warmup through the bundle's batching session, so every model's batches wait behind each record. A record
        that cannot join a batch (no common first dimension, over max_batch_size) runs alone."""
        size = task_size(inputs)
        if size is None or size > self.batching.max_batch_size:
            return loaded.run(signature, inputs)
        key = (loaded, signature, frozenset(), shape_key(inputs))
        return self.scheduler.submit(key, lambda batch: loaded.run(signature, batch), inputs, size)

    @staticmethod
    def _run(model: LoadedModel, signature: str, inputs, output_filter):
        with tf_errors(signature):
            return model.run(signature, inputs, list(output_filter) or None)

    def metadata(self, name, version, label, entrypoint="GRPC") -> tuple[int, get_model_metadata_pb2.SignatureDefMap]:
        with Tracked(self, name, "metadata", entrypoint) as tracked:
            servable = self.resolve(name, version, label)
            tracked.version = str(servable.version)
            return servable.version, servable.model.signature_def_map

    def status(self, name, version, label, entrypoint="GRPC") -> list[VersionState]:
        """Every version's state (all states, not only AVAILABLE), or only the one named. `label` is ignored, as
        TF Serving ignores a ModelSpec's version_label here (model_servers/get_model_status_impl.cc): a status asked
        for a label lists every version; GetModelMetadata resolves labels."""
        del label
        with Tracked(self, name, "status", entrypoint):
            try:
                model = self.manager.get(name)
            except NotFound as exc:
                raise ServingError(grpc.StatusCode.NOT_FOUND, str(exc)) from None
            states = sorted(model.versions.values(), key=lambda s: s.version)
            if version is not None:
                states = [s for s in states if s.version == version]
            if not states:
                what = f"version {version} of model {name}" if version is not None else f"any versions of model {name}"
                raise ServingError(grpc.StatusCode.NOT_FOUND, f"Could not find {what}")
            return states

    @property
    def inflight(self) -> int:
        return self._inflight

    def drain(self) -> None:
        """Shutdown: health turns NOT_SERVING and every queued batch runs (their callers get answers)."""
        self.stopping.set()
        if self.scheduler is not None:
            self.scheduler.close()
