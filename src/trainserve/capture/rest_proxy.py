"""The REST side of `trainserve capture`: every HTTP request forwarded to TF Serving's REST port as it came (method,
path, headers but the hop-by-hop ones, body), the answer returned as it came; one kept-alive upstream connection
per proxy thread. The proxy's own counters are served at `metrics_path` and not forwarded."""

from __future__ import annotations

import http.client
import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger(__name__)

# RFC 9110 7.6.1: headers that concern one connection, not the message; Host names the proxy.
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "transfer-encoding"}
    | {"upgrade", "host", "content-length"}
)
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4"
STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)  # an idle connection TF Serving closed


class RestForwarder(BaseHTTPRequestHandler):
    """One client request; `make_rest_proxy` binds the upstream and the metrics to a subclass."""

    upstream: str
    timeout_s: float
    metrics_path: str
    metrics: Callable[[], str]
    local = threading.local()  # this thread's connection to TF Serving
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        log.debug("%s %s", self.address_string(), fmt % args)

    def _forward(self) -> None:
        if self.command == "GET" and self.path.split("?")[0] == self.metrics_path:
            return self._reply(200, [("Content-Type", METRICS_CONTENT_TYPE)], self.metrics().encode())
        length = self.headers.get("Content-Length") or "0"
        if not length.isdigit():
            self.close_connection = True
            return self._reply(411, [("Content-Type", "application/json")], b'{"error": "expected Content-Length"}')
        body = self.rfile.read(int(length)) if int(length) else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        try:
            response = self._exchange(body, headers)
        except (OSError, http.client.HTTPException) as exc:
            message = json.dumps({"error": f"capture proxy: TF Serving at {self.upstream} did not answer: {exc}"})
            return self._reply(502, [("Content-Type", "application/json")], message.encode())
        status, reason, answer_headers, data = response
        self._reply(status, [(k, v) for k, v in answer_headers if k.lower() not in HOP_BY_HOP], data, reason)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _forward

    def _exchange(self, body: bytes | None, headers: dict) -> tuple[int, str, list, bytes]:
        """One request upstream; a connection TF Serving closed while idle is replaced once."""
        for attempt in (1, 2):
            connection = getattr(self.local, "connection", None)
            if connection is None:
                connection = self.local.connection = http.client.HTTPConnection(self.upstream, timeout=self.timeout_s)
            try:
                connection.request(self.command, self.path, body, headers)
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
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


def start_rest_proxy(
    port: int, upstream: str, metrics_path: str, metrics: Callable[[], str], timeout_s: float = 300
) -> ThreadingHTTPServer:
    """The REST pass-through on 0.0.0.0:`port` (0: any free port), serving from a background thread."""
    handler = type(
        "Forwarder",
        (RestForwarder,),
        {"upstream": upstream, "timeout_s": timeout_s, "metrics_path": metrics_path, "metrics": staticmethod(metrics)},
    )
    server = ThreadingHTTPServer(("0.0.0.0", port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="capture-rest", daemon=True).start()
    return server
