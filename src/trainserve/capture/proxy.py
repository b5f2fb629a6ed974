"""`trainserve capture` running: the gRPC pass-through on an event loop thread, the REST one on its own threads,
one TrafficWriter behind them; stopped by SIGTERM/SIGINT, in-flight calls finish first, queued records are written."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Callable

from trainserve.capture.config import ProxyConfig
from trainserve.capture.grpc_proxy import start_grpc_proxy, upstream_channel
from trainserve.capture.rest_proxy import start_rest_proxy
from trainserve.capture.sampling import ProxyCapture
from trainserve.tls import server_credentials
from trainserve.traffic.metrics import writer_lines
from trainserve.traffic.writer import TrafficWriter

log = logging.getLogger(__name__)


class CaptureProxy:
    """A started proxy: `.port` (gRPC) and `.rest_port` are bound; `stop()` ends it."""

    def __init__(self, config: ProxyConfig, uniform: Callable[[], float] | None = None):
        config.check()
        listen = config.listen_tls
        credentials = (
            server_credentials(listen.cert, listen.key, listen.client_ca, "--listen-tls") if listen.enabled else None
        )
        config.tls.credentials() if config.tls.enabled else None  # the upstream's files checked before any port opens
        self.writer = TrafficWriter(config.filename_prefix, config.capture)
        capture = ProxyCapture(self.writer, config.sampling_rate, uniform) if config.sampling_rate > 0 else None
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="capture-grpc", daemon=True)
        self._thread.start()
        try:
            self.server, self.port = self._call(self._start(config, capture, credentials))
        except BaseException:
            self._end_loop()
            self.writer.close()
            raise
        self.http = None
        if config.upstream_rest:
            metrics = lambda: "\n".join(writer_lines({config.filename_prefix: self.writer})) + "\n"  # noqa: E731
            self.http = start_rest_proxy(config.rest_port, config.upstream_rest, config.metrics_path, metrics)
        self.rest_port = self.http.server_address[1] if self.http else None

    def _call(self, coroutine, timeout: float | None = 30):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    async def _start(self, config: ProxyConfig, capture, credentials):
        self.channel = upstream_channel(config.upstream, config.tls)
        return await start_grpc_proxy(config.port, self.channel, capture, credentials)

    def stop(self, grace: float = 30) -> None:
        """No new calls; in-flight ones get `grace` seconds; then the records still queued are written."""
        if self.loop.is_closed():
            return
        if self.http is not None:
            self.http.shutdown()
            self.http.server_close()
        self._call(self.server.stop(grace), timeout=None)
        self._call(self.channel.close())
        self._end_loop()
        self.writer.close()

    def _end_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


def run_proxy(config: ProxyConfig) -> int:
    """Run until SIGTERM or SIGINT; returns the exit code."""
    stop = threading.Event()
    proxy = CaptureProxy(config)
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    log.info(
        "capture: gRPC on %d -> %s%s; writing %g of Predict calls under %s",
        proxy.port,
        config.upstream,
        f", REST on {proxy.rest_port} -> {config.upstream_rest}" if proxy.rest_port else "",
        config.sampling_rate,
        config.filename_prefix,
    )
    stop.wait()
    log.info("capture: stopping (in-flight calls finish, queued records are written)")
    proxy.stop()
    for sig, handler in previous.items():
        signal.signal(sig, handler)
    log.info("capture: stopped; %d record(s) written, dropped %s", proxy.writer.written, dict(proxy.writer.dropped))
    return 0
