"""serve-local's lifecycle: tensorflow_model_server's flags in, a running server out.

Start-up follows TF Serving (model_servers/main.cc, model_servers/server.cc): check the flags (the TLS
files included: serving/tls.py), load the configured models and block until each has a version AVAILABLE,
only then open the gRPC and REST ports; then poll the model directories (and the config file) until stopped.
Where serve-local differs, docs/tf-serving-behaviour.md says so. The one deliberate improvement: SIGTERM stops
accepting, finishes in-flight requests and exits 0 (tensorflow_model_server ignores SIGTERM, tensorflow/serving#1853).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

from trainserve.errors import TrainserveError
from trainserve.serving.capture import Capture, log_change
from trainserve.serving.config import (
    Batching,
    ServerOptions,
    parse_batching,
    parse_model_config,
    parse_monitoring,
    single_model_config,
)
from trainserve.serving.grpc_api import GrpcServer
from trainserve.serving.manager import ModelManager
from trainserve.serving.rest_api import start_rest_server
from trainserve.serving.servables import Servables
from trainserve.serving.tls import ServerTls, load_ssl_config
from trainserve.signals import stopped_by_signals, wait_until_stopped

log = logging.getLogger(__name__)

MIN_POLL_SECONDS = 0.2  # --file_system_poll_wait_seconds=0 would otherwise spin


def serve(options: ServerOptions, stop: threading.Event | None = None) -> int:
    """Run until SIGTERM/SIGINT (or `stop` is set); returns the exit code."""
    config = load_config(options)
    batching, metrics_path, tls = check_flags(options)
    capture = Capture.from_config(config, options.capture, options.model_config_file)  # logging_config
    log_change(None, capture)
    manager = ModelManager(
        options.tensorflow_intra_op_parallelism,
        options.tensorflow_inter_op_parallelism,
        options.enable_model_warmup,
        options.allow_version_labels_for_unavailable_models,
    )
    manager.configure(config)  # labels on versions not loaded yet: refused here unless the flag allows them
    stop = stop or threading.Event()
    with stopped_by_signals(stop):
        poll_seconds = max(options.file_system_poll_wait_seconds, MIN_POLL_SECONDS)
        log.info("waiting for %s to become AVAILABLE (ports open then)", ", ".join(sorted(manager.models)))
        if not manager.wait_until_available(poll_seconds, stop):
            log.info("stopped before any model was available")
            if capture is not None:
                capture.close()
            return 0

        servables = Servables(manager, batching, capture)
        grpc_server, http_server = _open_ports(options, servables, metrics_path, tls)
        poller = threading.Thread(target=_poll_loop, args=(servables, options, stop, poll_seconds), daemon=True)
        poller.start()
        wait_until_stopped(stop)
        _stop_serving(servables, grpc_server, http_server, grace_seconds=options.rest_api_timeout_in_ms / 1000)
        poller.join(timeout=5)
        if servables.capture is not None:
            servables.capture.close()  # after the last answer and the last reload: every record is queued by then
        manager.close()
        log.info("stopped cleanly")
        return 0


def load_config(options: ServerOptions):
    """The ModelServerConfig: from --model_config_file, else one model from --model_name/--model_base_path."""
    if options.model_config_file:
        return parse_model_config(Path(options.model_config_file))
    if not options.model_base_path:
        raise TrainserveError("expected --model_base_path (with --model_name) or --model_config_file")
    return single_model_config(options.model_name, options.model_base_path)


def check_flags(options: ServerOptions) -> tuple[Batching | None, str | None, ServerTls | None]:
    """(batching parameters or None, metrics path or None, gRPC TLS or None); bad combinations, bad
    certificates and taken ports fail here, before any model loads and any port opens."""
    batching = _batching(options)
    metrics_path = parse_monitoring(Path(options.monitoring_config_file) if options.monitoring_config_file else None)
    if metrics_path and not options.rest_api_port:
        raise TrainserveError("--monitoring_config_file needs --rest_api_port: metrics are served on the REST port")
    tls = _tls(options)
    check_ports(options)
    return batching, metrics_path, tls


def _tls(options: ServerOptions) -> ServerTls | None:
    if not options.ssl_config_file:
        return None
    if not options.port:
        raise TrainserveError("--ssl_config_file is set but --port is 0: TLS covers the gRPC port, expected one")
    tls = load_ssl_config(Path(options.ssl_config_file))
    log.info(
        "gRPC over TLS (%s client certificates); certificate expires %s; the REST port stays plaintext",
        "requiring" if tls.client_verify else "not requesting",
        f"{tls.expires:%Y-%m-%d %H:%M} UTC",
    )
    return tls


def _batching(options: ServerOptions) -> Batching | None:
    if options.batching_parameters_file and not options.enable_batching:
        raise TrainserveError("--batching_parameters_file is set but --enable_batching is not: expected both")
    if not options.enable_batching:
        return None
    return parse_batching(Path(options.batching_parameters_file) if options.batching_parameters_file else None)


def check_ports(options: ServerOptions) -> None:
    if options.port == options.rest_api_port:
        raise TrainserveError(f"--port and --rest_api_port are both {options.port}: expected different ports")
    if options.port:
        check_port_free(options.port, "--port")
    if options.rest_api_port:
        check_port_free(options.rest_api_port, "--rest_api_port")


def check_port_free(port: int, what: str) -> None:
    """Fail at start, with the flag's name, when a port is taken (TF Serving would die later, less clearly)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("0.0.0.0", port))
        except OSError as exc:
            raise TrainserveError(f"{what} {port} is not available ({exc.strerror}): expected a free port") from None


def _open_ports(
    options: ServerOptions, servables: Servables, metrics_path: str | None, tls: ServerTls | None
) -> tuple[GrpcServer | None, ThreadingHTTPServer | None]:
    """Start the APIs whose port is set (0 turns one off); the log lines are TF Serving's."""
    grpc_server = http_server = None
    if options.port:
        # The threads that run requests which join no batch (all of them with batching off): how many
        # model calls run at once. A request waiting for its batch holds none, so this does not cap
        # batches. TF Serving's default, 4 x CPUs.
        workers = options.grpc_max_threads or 4 * max(1, len(_affinity()))
        credentials = tls.credentials() if tls else None
        grpc_server = GrpcServer(servables, options.port, workers, options.enable_grpc_healthcheck_service, credentials)
        log.info("Running gRPC ModelServer at 0.0.0.0:%d ...", options.port)
    if options.rest_api_port:
        http_server = start_rest_server(servables, options.rest_api_port, metrics_path)
        log.info("Exporting HTTP/REST API at:localhost:%d ...", options.rest_api_port)
    return grpc_server, http_server


def _affinity() -> set[int]:
    """The CPUs this process may run on (fewer than os.cpu_count() under taskset or a cpuset)."""
    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))


def _stop_serving(
    servables: Servables, grpc_server: GrpcServer | None, http_server: ThreadingHTTPServer | None, grace_seconds: float
) -> None:
    """Stop accepting on both ports first, then let in-flight requests finish (gRPC within the grace),
    queued batches included."""
    log.info("stopping: no new requests; finishing %d in-flight request(s)", servables.inflight)
    if http_server is not None:
        http_server.shutdown()
    stopped = grpc_server.stop(grace=grace_seconds) if grpc_server is not None else None
    servables.drain()  # queued batches run now rather than at their timeout
    if stopped is not None:
        stopped.result()
        grpc_server.close()
    if http_server is not None:
        http_server.server_close()  # joins the request threads (daemon_threads is off)


def _poll_loop(servables: Servables, options: ServerOptions, stop: threading.Event, poll_seconds: float) -> None:
    """Until stopped: re-read the config file when due, then bring the loaded versions in line with disk."""
    reload_every = options.model_config_file_poll_wait_seconds if options.model_config_file else 0
    next_config = time.monotonic() + reload_every
    while not stop.wait(poll_seconds):
        if reload_every > 0 and time.monotonic() >= next_config:
            next_config = time.monotonic() + reload_every
            _reload_config(servables, options)
        try:
            servables.manager.poll()
        except Exception:  # a poll must never take the server down
            log.exception("polling the model directories failed; retrying")


def _reload_config(servables: Servables, options: ServerOptions) -> None:
    """Apply the config file again, its models and their logging; a broken edit is logged and the running
    config kept."""
    running = servables.capture
    capture = None
    try:
        config = load_config(options)
        capture = Capture.from_config(config, options.capture, options.model_config_file, running)
        servables.manager.configure(config)
    except TrainserveError as exc:
        if capture is not None:
            capture.close(keep=running)  # the writers opened for this edit only
        log.error("model config not reloaded, keeping the current one: %s", exc)
        return
    servables.capture = capture
    log_change(running, capture)
    if running is not None:
        running.close(keep=capture)  # the prefixes no longer named: their queues written, their files closed
