"""`trainserve proxy`'s options, declared once: type, default and help. The CLI is derived from them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainserve.errors import TrainserveError
from trainserve.options import option
from trainserve.tls import ClientTls
from trainserve.traffic.writer import WriterLimits

# 64 MiB: the copies the shadow holds, beside the proxy's own ~60 MiB at rest, the capture writer's queue and gRPC's
# buffers, well within the proxy sidecar's 512Mi limit (k8s/components/proxy/sidecar.yaml). Each copy being sent
# (at most --shadow-workers) also holds its rewritten request and the candidate's answer for a moment.
SHADOW_MAX_BYTES = 64 * 2**20

# The proxy's own pages on its REST port (trainserve.proxy.pages serves them).
LIVE_PATH = "/monitoring/proxy/healthz"
READY_PATH = "/monitoring/proxy/readyz"
METRICS_PATH = "/monitoring/proxy/metrics"
# The paths before the proxy was renamed from `capture`, answered too until the next release, so that probes and
# scrape configs written for them keep working through an upgrade (CHANGELOG.md).
FORMER_PATHS = {
    LIVE_PATH: "/monitoring/capture/healthz",
    READY_PATH: "/monitoring/capture/readyz",
    METRICS_PATH: "/monitoring/capture/metrics",
}


@dataclass(frozen=True)
class ListenTls:
    """TLS on the proxy's gRPC port, toward its clients: `--listen-tls-cert/-key`, plus `--listen-tls-client-ca`
    for mutual TLS (clients must then present a certificate that CA signed)."""

    cert: Path | None = option(None, "PEM certificate (chain) the proxy presents to its gRPC clients", metavar="FILE")
    key: Path | None = option(None, "PEM private key of --listen-tls-cert, unencrypted", metavar="FILE")
    client_ca: Path | None = option(
        None, "PEM CA that signs client certificates: clients must present one (mutual TLS)", metavar="FILE"
    )

    @property
    def enabled(self) -> bool:
        return bool(self.cert or self.key or self.client_ca)


@dataclass(frozen=True)
class ProxyConfig:
    """Everything `trainserve proxy` takes; each field is the flag of the same name."""

    upstream: str = option("localhost:8500", "TF Serving's gRPC address (HOST:PORT): every call goes there")
    upstream_rest: str = option("", "TF Serving's REST address (HOST:PORT); empty: no REST pass-through")
    port: int = option(8500, "gRPC port the clients call (0: any free port)")
    rest_port: int = option(8501, "REST port, forwarded to --upstream-rest (0: any free port)")
    filename_prefix: str = option("", "path prefix of the capture files, e.g. /captures/serving (required)")
    sampling_rate: float = option(1.0, "share of Predict calls written (0 to 1)")
    metrics_path: str = option(METRICS_PATH, "Prometheus counters on the REST port (not forwarded)")
    upstream_wait: float = option(
        2.0,
        "longest wait (s) for an unreachable TF Serving: reconnect attempts are at most this far apart (gRPC's own "
        "backoff grows to 120 s), and a call that finds it unreachable waits this long (within its deadline) first",
    )
    ready_model: str = option(
        "", "model the readiness check asks TF Serving about: Ready needs a version AVAILABLE (empty: any answer)"
    )
    stop_grace: float = option(
        20.0,
        "seconds SIGTERM gives the calls in flight (gRPC and REST), then the queued records; keep it under the "
        "pod's grace period less its preStop",
    )
    routing_file: Path | None = option(
        None,
        "routing file (trainserve.routing/1 JSON: candidate, shadow and canary shares of `stable` requests), polled; "
        "absent file: no routing",
        metavar="FILE",
    )
    routing_poll_seconds: float = option(10.0, "seconds between two reads of --routing-file")
    shadow_queue: int = option(256, "shadow copies waiting to be sent at most; a copy beyond them is dropped, counted")
    shadow_max_bytes: int = option(
        SHADOW_MAX_BYTES,
        "bytes the shadow copies may hold at most, queued or being sent (each its request and stable's answer); a "
        "copy beyond them is dropped, counted. 64 MiB leaves the k8s proxy sidecar's 512Mi room for the rest",
    )
    shadow_shed_in_flight: int = option(
        8,
        "shed shadow copies (never sent, counted) while this many client calls or more are in flight through the "
        "proxy, whatever their latency: a hard ceiling",
    )
    shadow_shed_latency_margin: float = option(
        0.2,
        "shed shadow copies (never sent, counted) while the recent shadowed client calls are slower than the quiet "
        "calls of their model and size (made while the route had no shadow, or that no copy of this proxy "
        "overlapped) by more than this fraction (median of the window's slowdowns): copies use spare capacity only",
        metavar="FRACTION",
    )
    shadow_shed_latency_window: int = option(
        8, "the recent shadowed client calls whose median slowdown --shadow-shed-latency-margin reads", metavar="CALLS"
    )
    shadow_workers: int = option(4, "shadow copies sent at once")
    shadow_timeout: float = option(10.0, "deadline (s) of one shadow call")
    capture: WriterLimits = option(factory=WriterLimits)
    tls: ClientTls = option(factory=ClientTls)  # toward TF Serving
    listen_tls: ListenTls = option(factory=ListenTls)  # toward the clients

    def check(self) -> None:
        """Bad flags fail here in one line, before any port opens."""
        if not self.filename_prefix or self.filename_prefix.endswith("/"):
            raise TrainserveError(
                f"--filename-prefix {self.filename_prefix!r}: expected a path prefix for the capture files, "
                "e.g. /captures/serving"
            )
        if not 0.0 <= self.sampling_rate <= 1.0:
            raise TrainserveError(f"--sampling-rate {self.sampling_rate}: expected a share between 0 and 1")
        if ":" not in self.upstream or (self.upstream_rest and ":" not in self.upstream_rest):
            raise TrainserveError(f"--upstream {self.upstream!r} / --upstream-rest: expected HOST:PORT")
        if self.upstream_rest and self.port and self.port == self.rest_port:
            raise TrainserveError(f"--port and --rest-port are both {self.port}: expected different ports")
        if not 0.0 < self.upstream_wait <= 120.0 or self.stop_grace < 0.0:
            raise TrainserveError(
                f"--upstream-wait {self.upstream_wait} / --stop-grace {self.stop_grace}: expected 0 < wait <= 120 s "
                "and a grace >= 0 s"
            )
        if (
            self.routing_poll_seconds <= 0
            or self.shadow_queue < 1
            or self.shadow_workers < 1
            or self.shadow_timeout <= 0
            or self.shadow_max_bytes < 1
            or self.shadow_shed_in_flight < 1
        ):
            raise TrainserveError(
                f"--routing-poll-seconds {self.routing_poll_seconds} / --shadow-queue {self.shadow_queue} / "
                f"--shadow-workers {self.shadow_workers} / --shadow-timeout {self.shadow_timeout} / --shadow-max-bytes "
                f"{self.shadow_max_bytes} / --shadow-shed-in-flight {self.shadow_shed_in_flight}: expected a poll and "
                "a timeout > 0 s, and a queue, workers, bytes and calls >= 1"
            )
        if not self.shadow_shed_latency_margin > 0 or self.shadow_shed_latency_window < 1:
            raise TrainserveError(
                f"--shadow-shed-latency-margin {self.shadow_shed_latency_margin} / --shadow-shed-latency-window "
                f"{self.shadow_shed_latency_window}: expected a margin > 0 (a fraction of the quiet latency) and a "
                "window of >= 1 calls"
            )
        listen = self.listen_tls
        if listen.enabled and not (listen.cert and listen.key):
            raise TrainserveError("--listen-tls-* needs --listen-tls-cert and --listen-tls-key: expected both")
        self.capture.check()
        self.tls.check()
