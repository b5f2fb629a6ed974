"""Shadow: a copy of a `stable` request sent to the candidate after stable has answered, its answer compared with
stable's (trainserve.proxy.shadow_compare) and thrown away. The client's answer never waits for it, and the copy
takes nothing the client needs:

- `offer` only puts the copy on a queue bounded in copies (`--shadow-queue`) and in bytes (`--shadow-max-bytes`:
  the request and stable's answer of every copy held, queued or being sent); a copy beyond either is dropped;
- a copy is shed, never sent, when offered or when a worker takes it, while the clients' recent latency is over
  that of the calls no copy overlapped (while the route had no shadow, the calls of every replica; since, this
  replica's) by more than `--shadow-shed-latency-margin` (shadow_headroom), or while the
  clients' calls in flight through the proxy number `--shadow-shed-in-flight` or more (a hard ceiling): the
  server's spare capacity is the shadow's, not its own;
- the rewrite to the candidate's version and the comparison (protobuf parsing, numpy) run in a thread pool, off
  the event loop that forwards the clients' calls.

Each copy ends in one outcome, so offered = their sum: compared, incomparable (no comparable output in common),
shed, dropped_queue_full, error (the candidate failed, or its answer did not parse), or cut (queued or in flight
at stop). A dropped or shed copy is never sent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc
from google.protobuf.message import DecodeError

from trainserve.errors import TrainserveError
from trainserve.proxy.config import ProxyConfig
from trainserve.proxy.grpc_proxy import PREDICT
from trainserve.proxy.proxy_metrics import ProxyMetrics
from trainserve.proxy.shadow_compare import Incomparable, compare
from trainserve.proxy.shadow_headroom import Headroom, kind
from trainserve.proxy.wire import request_spec, with_version

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Copy:
    """One shadow copy: the client's request, stable's answer, and where the copy goes."""

    model: str
    version: int
    request: bytes
    stable: bytes
    metadata: tuple
    tolerance: float | None = None  # the route's shadow_tolerance when the copy was offered

    @property
    def size(self) -> int:
        """The bytes the byte budget counts for it."""
        return len(self.request) + len(self.stable)


def addressed(request: bytes, version: int) -> bytes:
    """`request` sent to `version`: the rewrite copies every byte, so large requests pay it off the loop."""
    return with_version(request, request_spec(request), version)


class Shadow:
    """Created and used on the proxy's event loop; `start()` there, then `offer()` per request, `stop()` at the end.
    `in_flight` says how many client calls the proxy is answering now; `clock` (seconds) times the copies against
    the clients' calls (trainserve.proxy.shadow_headroom)."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        metrics: ProxyMetrics,
        config: ProxyConfig,
        in_flight: Callable[[], int] = lambda: 0,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.call = channel.unary_unary(PREDICT)
        self.metrics, self.config, self.in_flight = metrics, config, in_flight
        skew = config.routing_poll_seconds + config.shadow_timeout  # replicas' copies may overlap calls this long
        self.headroom = Headroom(config.shadow_shed_latency_margin, config.shadow_shed_latency_window, skew, clock)
        self.queue: asyncio.Queue = asyncio.Queue(config.shadow_queue)
        self.held_bytes = 0  # of the copies queued or being sent
        self.metrics.queued, self.metrics.held_bytes = self.queue.qsize, lambda: self.held_bytes
        self._executor = ThreadPoolExecutor(config.shadow_workers, thread_name_prefix="shadow")
        self._tasks: list[asyncio.Task] = []
        self._busy: dict[asyncio.Task, Copy] = {}

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._work()) for _ in range(self.config.shadow_workers)]

    def offer(
        self, model: str, version: int, request: bytes, stable: bytes, metadata: tuple, latency: float | None = None
    ) -> None:
        """Queue one copy, or count why not; never waits. Called on the event loop's thread. `latency`: how long
        the client's call took (s), for the headroom's view of the clients' latency."""
        if latency is not None:
            self.headroom.client_call(kind(model, len(request)), latency)
        copy = Copy(model, version, request, stable, metadata, self._tolerance(model, version))
        if self._busy_server():
            self.metrics.shadow_outcome(model, version, "shed")
        elif self.queue.full() or self.held_bytes + copy.size > self.config.shadow_max_bytes:
            self.metrics.shadow_outcome(model, version, "dropped_queue_full")
        else:
            self.held_bytes += copy.size
            self.queue.put_nowait(copy)

    def unshadowed(self, model: str, request_bytes: int, latency: float) -> None:
        """A client's call of `model`, whose route has no shadow share, took `latency` s: quiet for every replica,
        the headroom's baseline (trainserve.proxy.shadow_headroom)."""
        self.headroom.unshadowed_call(kind(model, request_bytes), latency)

    def _tolerance(self, model: str, version: int) -> float | None:
        """The route's shadow_tolerance, while it still routes `version` (the routing file may have moved on)."""
        router = self.metrics.router
        route = router.routing.route(model) if router is not None else None
        return route.shadow_tolerance if route is not None and route.candidate == version else None

    def _busy_server(self) -> bool:
        return self.in_flight() >= self.config.shadow_shed_in_flight or self.headroom.inflated()

    async def _work(self) -> None:
        me = asyncio.current_task()
        while True:
            copy = await self.queue.get()
            self._busy[me] = copy
            try:
                outcome = "shed" if self._busy_server() else await self._send(copy)
                if outcome is not None:
                    self.metrics.shadow_outcome(copy.model, copy.version, outcome)
            finally:
                self._busy.pop(me, None)
                self.held_bytes -= copy.size

    async def _send(self, copy: Copy) -> str | None:
        """Send one copy and compare the answers; returns its outcome, None when counted compared."""
        loop = asyncio.get_running_loop()
        try:
            sent = await loop.run_in_executor(self._executor, addressed, copy.request, copy.version)
        except ValueError as exc:  # a request that does not parse, a version protobuf cannot hold
            log.debug("proxy: shadow copy to %s version %d not addressed: %s", copy.model, copy.version, exc)
            return "error"
        start = time.perf_counter()
        self.headroom.copy_sent()
        try:
            answer = await self.call(sent, timeout=self.config.shadow_timeout, metadata=copy.metadata)
        except grpc.aio.AioRpcError as err:
            log.debug("proxy: shadow call to %s version %d: %s", copy.model, copy.version, err.code().name)
            return "error"
        finally:
            self.headroom.copy_back()
        micros = (time.perf_counter() - start) * 1e6
        try:
            comparison = await loop.run_in_executor(self._executor, compare, copy.stable, answer, copy.tolerance)
        except Incomparable as exc:
            log.debug("proxy: shadow answer of %s version %d: %s", copy.model, copy.version, exc)
            return "incomparable"
        except (DecodeError, TrainserveError, ValueError) as exc:
            log.debug("proxy: shadow answer of %s version %d did not parse: %s", copy.model, copy.version, exc)
            return "error"
        self.metrics.compared(copy.model, copy.version, comparison, micros)
        return None

    async def stop(self) -> int:
        """Cancel the workers; copies still queued or in flight are counted cut. Returns how many."""
        cut = list(self._busy.values())
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        while not self.queue.empty():
            cut.append(self.queue.get_nowait())
        for copy in cut:
            self.metrics.shadow_outcome(copy.model, copy.version, "cut")
        self._executor.shutdown(wait=False, cancel_futures=True)
        return len(cut)
