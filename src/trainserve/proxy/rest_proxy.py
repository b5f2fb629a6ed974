"""The REST side of `trainserve proxy`: every HTTP request forwarded to TF Serving's REST port as it came (method,
path, headers but the hop-by-hop ones, body, a chunked one included), the answer returned as it came; one kept-alive
upstream connection per proxy thread. The proxy's own pages (counters, liveness, readiness) are served here and
not forwarded. At stop, the requests in flight finish within the grace, as gRPC's do; those still running at its
end are cut and counted. Inference requests are routed as gRPC's are (a request naming no version and no label,
for a routed model, is sent as `/labels/stable`) and counted by the version their label names, asked of TF
Serving's REST metadata API (trainserve.proxy.labels), since a REST answer does not say."""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import re
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from trainserve.proxy.labels import LabelVersions, label_version
from trainserve.proxy.proxy_metrics import ProxyMetrics
from trainserve.proxy.router import CANARY, PASS, Router
from trainserve.proxy.routing import STABLE_LABEL
from trainserve.proxy.upstream import REST, UpstreamLog
from trainserve.traffic.origin import origin_of

log = logging.getLogger(__name__)

# RFC 9110 7.6.1: headers that concern one connection, not the message; Host names the proxy.
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "transfer-encoding"}
    | {"upgrade", "host", "content-length"}
)
STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)  # an idle connection TF Serving closed
Page = Callable[[], tuple[int, str, bytes]]  # (HTTP status, content type, body) of one of the proxy's own pages
# TF Serving's REST inference paths (http_rest_api_handler.cc): the model, then a version or a label, then the verb.
INFERENCE = re.compile(r"^/v1/models/([^/:]+)(?:/versions/(\d+)|/labels/([^/:]+))?:(predict|classify|regress)$")
# HTTP status -> the gRPC code TF Serving maps to it (ToHTTPStatusCode, model_servers/http_server.cc), so the
# proxy's REST counts carry the status names its gRPC counts do; 502 is the proxy's own (TF Serving unreachable).
HTTP_CODES = {200: "OK", 400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 408: "DEADLINE_EXCEEDED", 409: "ABORTED"}
HTTP_CODES |= {429: "RESOURCE_EXHAUSTED", 499: "CANCELLED", 500: "INTERNAL", 501: "UNIMPLEMENTED", 502: "UNAVAILABLE"}
HTTP_CODES |= {503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED"}


class BadBody(ValueError):
    """A request body that cannot be read as its headers announce it."""


class InFlight:
    """Requests being answered, and the connections open, so that a stop can wait for the first and close the rest."""

    def __init__(self) -> None:
        self._idle = threading.Condition()
        self.requests = 0
        self.connections: set[socket.socket] = set()
        self.stopping = False

    def enter(self) -> None:
        with self._idle:
            self.requests += 1

    def leave(self) -> None:
        with self._idle:
            self.requests -= 1
            self._idle.notify_all()

    def wait_idle(self, deadline: float) -> int:
        """Wait until no request is in flight or `deadline` (time.monotonic) passes; returns how many still are."""
        with self._idle:
            self._idle.wait_for(lambda: self.requests == 0, max(0.0, deadline - time.monotonic()))
            return self.requests


def read_chunked(stream) -> bytes:
    """A `Transfer-Encoding: chunked` body (RFC 9112 7.1), trailers read and left out."""
    parts = []
    while True:
        line = stream.readline(65537)
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise BadBody(f"chunk size {line[:40]!r}: expected hexadecimal digits") from None
        if size == 0:
            break
        parts.append(stream.read(size))
        if stream.read(2) != b"\r\n":
            raise BadBody("expected CRLF after a chunk")
    while stream.readline(65537) not in (b"\r\n", b"\n", b""):  # trailer fields
        pass
    return b"".join(parts)


class RestForwarder(BaseHTTPRequestHandler):
    """One client connection; `start_rest_proxy` binds the upstream, the pages and the bookkeeping to a subclass."""

    upstream: str
    timeout_s: float
    pages: dict[str, Page]
    upstream_log: UpstreamLog
    inflight: InFlight
    router: Router
    metrics: ProxyMetrics
    labels: LabelVersions
    local = threading.local()  # this thread's connection to TF Serving
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        log.debug("%s %s", self.address_string(), fmt % args)

    def setup(self) -> None:
        super().setup()
        self.inflight.connections.add(self.connection)

    def finish(self) -> None:
        self.inflight.connections.discard(self.connection)
        super().finish()

    def _forward(self) -> None:
        self.inflight.enter()
        try:
            if self.inflight.stopping:  # the answer ends this connection: the client reconnects elsewhere
                self.close_connection = True
            self._answer()
        finally:
            self.inflight.leave()

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _forward

    def _answer(self) -> None:
        page = self.pages.get(self.path.split("?")[0]) if self.command == "GET" else None
        if page is not None:
            status, content_type, data = page()
            return self._reply(status, [("Content-Type", content_type)], data)
        try:
            body = self._body()
        except BadBody as exc:
            self.close_connection = True
            return self._reply(400, [("Content-Type", "application/json")], json.dumps({"error": str(exc)}).encode())
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        started = time.perf_counter()
        target = INFERENCE.match(self.path) if self.command == "POST" else None
        decision, path = self._route(target)
        try:
            response = self._exchange(body, headers, path)
        except (OSError, http.client.HTTPException) as exc:
            self.upstream_log.failed(REST, f"{type(exc).__name__}: {exc}")
            self._count(target, decision, 502, started)
            message = json.dumps({"error": f"proxy: TF Serving at {self.upstream} did not answer: {exc}"})
            return self._reply(502, [("Content-Type", "application/json")], message.encode())
        self.upstream_log.answered(REST)
        status, reason, answer_headers, data = response
        self._count(target, decision, status, started)
        self._reply(status, [(k, v) for k, v in answer_headers if k.lower() not in HOP_BY_HOP], data, reason)

    def _route(self, target):
        """(where the request goes, the path sent upstream): a canary's label becomes the candidate's version, and a
        routed model's request naming neither a version nor a label is sent to `stable`."""
        if target is None:
            return PASS, self.path
        model, version, label, verb = target.groups()
        if origin_of(self.headers.items()) is not None:  # trainserve's own call: `stable` means stable
            return PASS, self.path
        decision = self.router.decide(model, None if version else label or "", self.headers.get)
        if decision.route == CANARY:
            return decision, f"/v1/models/{model}/versions/{decision.version}:{verb}"
        if decision.as_stable:
            return decision, f"/v1/models/{model}/labels/{STABLE_LABEL}:{verb}"
        return decision, self.path

    def _count(self, target, decision, status: int, started: float) -> None:
        """Count an inference request by version: the one the path named, the candidate for a canary, else the
        version its label names (TF Serving's REST answer does not say)."""
        if target is None:
            return
        micros = (time.perf_counter() - started) * 1e6  # the call's own time, not a label's lookup
        model, version, label, verb = target.groups()
        if decision.route == CANARY:
            version = str(decision.version)
        elif version is None:
            version = self._label_version(model, STABLE_LABEL if decision.as_stable else label or "", status == 200)
        self.metrics.request(model, version, verb, HTTP_CODES.get(status, "UNKNOWN"), decision.route, micros)

    def _label_version(self, model: str, label: str, answered: bool) -> str:
        """For an answered call, the version TF Serving's metadata API says `label` names (an answer at most
        LabelVersions.max_age_s old, kept fresh off the request's path); else, or when it does not say, the version
        last seen answering the label over gRPC. Only answered calls ask, so names a client makes up are never asked
        about nor kept."""
        asked = self.labels.version(model, label) if answered else None
        return asked or self.metrics.label_versions.get((model, label), "")

    def _body(self) -> bytes | None:
        """The request's body, whole: by Content-Length, or chunk by chunk (forwarded with its length)."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return read_chunked(self.rfile)
        length = self.headers.get("Content-Length") or "0"
        if not length.isdigit():
            raise BadBody(f"Content-Length {length!r}: expected a number of bytes")
        return self.rfile.read(int(length)) if int(length) else None

    def _exchange(self, body: bytes | None, headers: dict, path: str) -> tuple[int, str, list, bytes]:
        """One request upstream; a connection TF Serving closed while idle is replaced once."""
        for attempt in (1, 2):
            connection = getattr(self.local, "connection", None)
            if connection is None:
                connection = self.local.connection = http.client.HTTPConnection(self.upstream, timeout=self.timeout_s)
            try:
                connection.request(self.command, path, body, headers)
                answer = connection.getresponse()
                return answer.status, answer.reason, answer.getheaders(), answer.read()
            except STALE:
                connection.close()
                self.local.connection = None
                if attempt == 2:
                    raise
            except (OSError, http.client.HTTPException):
                connection.close()
                self.local.connection = None
                raise
        raise AssertionError("unreachable")

    def _reply(self, status: int, headers: list, data: bytes, reason: str | None = None) -> None:
        self.send_response(status, reason)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


class RestProxy:
    """The REST pass-through, serving from a background thread; `stop` drains it."""

    def __init__(
        self,
        port: int,
        upstream: str,
        pages: dict[str, Page],
        upstream_log: UpstreamLog,
        timeout_s: float,
        router: Router | None = None,
        metrics: ProxyMetrics | None = None,
    ):
        self.inflight = InFlight()
        attributes = {"upstream": upstream, "timeout_s": timeout_s, "pages": pages}
        attributes |= {"upstream_log": upstream_log, "inflight": self.inflight}
        attributes |= {"router": router or Router(None), "metrics": metrics or ProxyMetrics()}
        routed = attributes["router"]
        self.labels = attributes["labels"] = LabelVersions(
            lambda model, label: label_version(upstream, model, label),
            wanted=lambda: [(model, STABLE_LABEL) for model in routed.routing.models],  # known before their calls
        )
        self.labels.start()
        self.server = ThreadingHTTPServer(("0.0.0.0", port), type("Forwarder", (RestForwarder,), attributes))
        self.server.daemon_threads = True  # an idle kept-alive connection must not hold the process at exit
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, args=(0.1,), name="proxy-rest", daemon=True).start()

    def stop(self, deadline: float) -> int:
        """Accept nothing more, let the requests in flight finish until `deadline` (time.monotonic), then close
        every connection; returns how many requests were cut."""
        self.inflight.stopping = True
        self.labels.stop()
        self.server.shutdown()
        self.server.server_close()
        cut = self.inflight.wait_idle(deadline)
        for connection in list(self.inflight.connections):  # idle kept-alive ones, and any cut
            with contextlib.suppress(OSError):  # already closed by its client
                connection.shutdown(socket.SHUT_RDWR)
        return cut


def start_rest_proxy(
    port: int,
    upstream: str,
    pages: dict[str, Page],
    upstream_log: UpstreamLog,
    timeout_s: float = 300,
    router: Router | None = None,
    metrics: ProxyMetrics | None = None,
) -> RestProxy:
    """The REST pass-through on 0.0.0.0:`port` (0: any free port), started; inference requests routed by `router`
    and counted in `metrics`."""
    return RestProxy(port, upstream, pages, upstream_log, timeout_s, router, metrics)
