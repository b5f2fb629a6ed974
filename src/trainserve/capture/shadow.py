"""Shadow: a copy of a `stable` request sent to the candidate after stable has answered, its answer compared with
stable's and thrown away. The client's answer never waits for it: `offer` only puts the pair on a bounded queue
(a full queue drops it, counted), and a few workers on the proxy's event loop send and compare.

Each copy ends in one outcome: compared, error (the candidate failed, or the answers cannot be compared),
dropped_queue_full, or cut (still queued or in flight at stop), so offered = the sum of the four.
Comparison is per example (the first dimension of the outputs): an example flips when the top class of any
classification output ([N, K], K > 1) differs; other outputs (regression) add |candidate - stable| summed.
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
import numpy as np

from trainserve.capture.grpc_proxy import PREDICT
from trainserve.capture.proxy_metrics import ProxyMetrics
from trainserve.capture.wire import request_spec, with_version
from trainserve.errors import TrainserveError
from trainserve.protos import predict_pb2
from trainserve.tensors import from_tensor_proto

log = logging.getLogger(__name__)


class Incomparable(ValueError):
    """Two answers whose outputs differ in names or shapes."""


def compare(stable: bytes, candidate: bytes) -> tuple[int, int, float]:
    """(examples compared, examples whose top class flipped, sum of |candidate - stable| over regression
    outputs) for two serialized PredictResponses to the same request."""
    a, b = (predict_pb2.PredictResponse.FromString(r).outputs for r in (stable, candidate))
    if set(a) != set(b) or not a:
        raise Incomparable(f"outputs {sorted(a)} against {sorted(b)}")
    rows, flipped, abs_diff = None, None, 0.0
    for key in sorted(a):
        x, y = from_tensor_proto(a[key]), from_tensor_proto(b[key])
        if x.shape != y.shape or x.ndim == 0 or (rows is not None and x.shape[0] != rows):
            raise Incomparable(f"output {key!r}: shapes {list(x.shape)} and {list(y.shape)}")
        rows = x.shape[0]
        if flipped is None:
            flipped = np.zeros(rows, bool)
        if x.ndim == 2 and x.shape[1] > 1 and np.issubdtype(x.dtype, np.number):
            flipped |= x.argmax(axis=1) != y.argmax(axis=1)
        elif np.issubdtype(x.dtype, np.number):
            abs_diff += float(np.abs(y.astype(np.float64) - x).sum())
    return int(rows), int(flipped.sum()), abs_diff


class Shadow:
    """Created and used on the proxy's event loop; `start()` there, then `offer()` per request, `stop()` at the end."""

    def __init__(self, channel: grpc.aio.Channel, metrics: ProxyMetrics, capacity: int, workers: int, timeout_s: float):
        self.call = channel.unary_unary(PREDICT)
        self.metrics, self.workers, self.timeout_s = metrics, workers, timeout_s
        self.queue: asyncio.Queue = asyncio.Queue(capacity)
        self.metrics.queued = self.queue.qsize
        self._tasks: list[asyncio.Task] = []
        self._busy: dict[asyncio.Task, tuple[str, int]] = {}

    def start(self) -> None:
        self._tasks = [asyncio.get_running_loop().create_task(self._work()) for _ in range(self.workers)]

    def offer(self, model: str, version: int, request: bytes, stable: bytes, metadata: tuple) -> None:
        """Queue one copy; never waits. Called on the event loop's thread."""
        try:
            self.queue.put_nowait((model, version, request, stable, metadata))
        except asyncio.QueueFull:
            self.metrics.shadow_outcome(model, version, "dropped_queue_full")

    async def _work(self) -> None:
        me = asyncio.current_task()
        while True:
            model, version, request, stable, metadata = await self.queue.get()
            self._busy[me] = (model, version)
            try:
                await self._send(model, version, request, stable, metadata)
            finally:
                self._busy.pop(me, None)

    async def _send(self, model: str, version: int, request: bytes, stable: bytes, metadata: tuple) -> None:
        start = time.perf_counter()
        try:
            answer = await self.call(
                with_version(request, request_spec(request), version), timeout=self.timeout_s, metadata=metadata
            )
        except grpc.aio.AioRpcError as err:
            self.metrics.shadow_outcome(model, version, "error")
            log.debug("capture: shadow call to %s version %d: %s", model, version, err.code().name)
            return
        micros = (time.perf_counter() - start) * 1e6
        try:
            pairs, flips, abs_diff = compare(stable, answer)
        except (Incomparable, TrainserveError, ValueError) as exc:
            self.metrics.shadow_outcome(model, version, "error")
            log.debug("capture: shadow answer of %s version %d not comparable: %s", model, version, exc)
            return
        self.metrics.compared(model, version, pairs, flips, abs_diff, micros)

    async def stop(self) -> int:
        """Cancel the workers; copies still queued or in flight are counted cut. Returns how many."""
        cut = list(self._busy.values())
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        while not self.queue.empty():
            model, version, *_ = self.queue.get_nowait()
            cut.append((model, version))
        for model, version in cut:
            self.metrics.shadow_outcome(model, version, "cut")
        return len(cut)
