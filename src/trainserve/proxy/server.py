"""`trainserve proxy` running: the gRPC pass-through on an event loop thread, the REST one on its own threads,
one TrafficWriter behind them. SIGTERM/SIGINT: nothing new is accepted, the calls in flight (gRPC and REST) finish
within `--stop-grace`, the queued records are written in what is left of it, and one line says what could not be
finished."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from trainserve.proxy.config import LIVE_PATH, READY_PATH, ProxyConfig
from trainserve.proxy.grpc_proxy import Forwarder, start_grpc_proxy, upstream_channel
from trainserve.proxy.pages import live_page, metrics_page, ready_page, with_former_paths
from trainserve.proxy.proxy_metrics import ProxyMetrics
from trainserve.proxy.rest_proxy import start_rest_proxy
from trainserve.proxy.router import Router, describe
from trainserve.proxy.sampling import ProxyCapture
from trainserve.proxy.shadow import Shadow
from trainserve.proxy.upstream import GRPC, PROBE_SECONDS, REST, UpstreamLog, grpc_answers, rest_answers
from trainserve.signals import stopped_by_signals, wait_until_stopped
from trainserve.tls import server_credentials
from trainserve.traffic.accounting import Accounting
from trainserve.traffic.writer import TrafficWriter

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stopped:
    """What a stop could not finish within its grace: calls cut, and the writer's account of its records."""

    grpc_cut: int
    rest_cut: int
    records: Accounting
    shadow_cut: int

    def summary(self) -> str:
        return (
            f"{self.grpc_cut} gRPC and {self.rest_cut} REST call(s) cut at the grace's end; "
            f"{self.shadow_cut} shadow cop(ies) not sent; records {self.records.summary()}"
        )


class Proxy:
    """A started proxy: `.port` (gRPC) and `.rest_port` are bound; `stop()` ends it."""

    def __init__(self, config: ProxyConfig, uniform: Callable[[], float] | None = None):
        config.check()
        self.config = config
        # A routing file it cannot follow is refused in one line (routing_refused 1): the proxy starts with no
        # routing and follows the file once it is fixed, rather than crash-loop while the running replicas carry on.
        self.router = Router(config.routing_file, uniform)
        listen = config.listen_tls
        credentials = (
            server_credentials(listen.cert, listen.key, listen.client_ca, "--listen-tls") if listen.enabled else None
        )
        config.tls.credentials() if config.tls.enabled else None  # the upstream's files checked before any port opens
        self.writer = TrafficWriter(config.filename_prefix, config.capture)
        self.capture = ProxyCapture(self.writer, config.sampling_rate, uniform) if config.sampling_rate > 0 else None
        self.upstream = UpstreamLog({GRPC: config.upstream, REST: config.upstream_rest or "(none)"})
        self.metrics = ProxyMetrics()
        self.metrics.router = self.router
        self.stopping, self.stopped = False, None
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="proxy-grpc", daemon=True)
        self._thread.start()
        try:
            self.server, self.port = self._call(self._start(credentials))
        except BaseException:
            self._call(self.shadow.stop()) if getattr(self, "shadow", None) else None
            self._end_loop()
            self.writer.close()
            raise
        self.rest = None
        if config.upstream_rest:
            pages = with_former_paths(
                {
                    config.metrics_path: metrics_page(config.filename_prefix, self.writer, self.upstream, self.metrics),
                    LIVE_PATH: live_page,
                    READY_PATH: ready_page(self.why_not_ready),
                }
            )
            self.rest = start_rest_proxy(
                config.rest_port, config.upstream_rest, pages, self.upstream, router=self.router, metrics=self.metrics
            )
        self.rest_port = self.rest.port if self.rest else None
        self.router.watch(config.routing_poll_seconds)

    def _call(self, coroutine, timeout: float | None = 30):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    async def _start(self, credentials):
        config = self.config
        self.channel = upstream_channel(config.upstream, config.tls, config.upstream_wait)
        self.forwarder = Forwarder(
            self.channel, self.capture, self.upstream, config.upstream_wait, self.router, self.metrics
        )
        self.shadow = Shadow(self.channel, self.metrics, config, self._client_calls_in_flight)
        self.shadow.start()
        self.forwarder.shadow = self.shadow
        return await start_grpc_proxy(config.port, self.forwarder, credentials)

    def _client_calls_in_flight(self) -> int:
        """gRPC and REST calls the proxy is answering now: the shadow sheds its copies while they are many."""
        rest = getattr(self, "rest", None)
        return self.forwarder.in_flight + (rest.inflight.requests if rest is not None else 0)

    def why_not_ready(self) -> str | None:
        """None when TF Serving answers a status request on each side the proxy forwards; else why not."""
        if self.stopping:
            return "stopping"
        config = self.config
        try:
            reached, reason = self._call(
                grpc_answers(self.channel, config.ready_model, config.upstream_wait), PROBE_SECONDS * 3
            )
        except (RuntimeError, concurrent.futures.TimeoutError) as exc:  # the loop is closing, or hung
            reached, reason = False, f"no answer from the proxy's gRPC loop ({type(exc).__name__})"
        if not self._note(GRPC, reached, reason):
            return f"TF Serving's gRPC at {config.upstream}: {reason}"
        if config.upstream_rest:
            reached, reason = rest_answers(config.upstream_rest, config.ready_model)
            if not self._note(REST, reached, reason):
                return f"TF Serving's REST at {config.upstream_rest}: {reason}"
        return None

    def _note(self, side: str, reached: bool, reason: str | None) -> bool:
        """A readiness check's outcome goes into the upstream log like a call's; returns whether it is ready."""
        if reached:
            self.upstream.answered(side)
        else:
            self.upstream.failed(side, reason)
        return reached and reason is None

    def stop(self, grace: float | None = None) -> Stopped:
        """No new calls; those in flight get `grace` seconds (default --stop-grace), gRPC and REST alike; then the
        queued records are written in what is left of it (at most --capture-drain-seconds); the rest are counted
        lost. Returns what could not be finished."""
        if self.stopped is not None:
            return self.stopped
        grace = self.config.stop_grace if grace is None else grace
        deadline = time.monotonic() + grace
        self.stopping = self.forwarder.stopping = True
        log.info(
            "proxy: stopping: %d gRPC and %d REST call(s) in flight get up to %g s, then the queued records",
            self.forwarder.in_flight,
            self.rest.inflight.requests if self.rest is not None else 0,
            grace,
        )
        grpc_stopped = asyncio.run_coroutine_threadsafe(self.server.stop(grace), self.loop)
        rest_cut = self.rest.stop(deadline) if self.rest is not None else 0
        grpc_stopped.result()
        self.router.stop()
        shadow_cut = self._call(self.shadow.stop())
        self._call(self.channel.close())
        self._end_loop()
        left = max(0.0, deadline - time.monotonic())
        records = self.writer.close(min(left, self.config.capture.drain_seconds))
        self.stopped = Stopped(self.forwarder.cut, rest_cut, records, shadow_cut)
        return self.stopped

    def _end_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


def run_proxy(config: ProxyConfig) -> int:
    """Run until SIGTERM or SIGINT; returns the exit code."""
    stop = threading.Event()
    proxy = Proxy(config)
    with stopped_by_signals(stop):
        log.info(
            "proxy: gRPC on %d -> %s%s; writing %g of Predict calls under %s; routing%s: %s",
            proxy.port,
            config.upstream,
            f", REST on {proxy.rest_port} -> {config.upstream_rest}" if proxy.rest_port else "",
            config.sampling_rate,
            config.filename_prefix,
            f" from {config.routing_file} every {config.routing_poll_seconds:g} s" if config.routing_file else "",
            describe(proxy.router.routing),
        )
        wait_until_stopped(stop)
        stopped = proxy.stop()
    log.info("proxy: stopped; %s", stopped.summary())
    return 0
