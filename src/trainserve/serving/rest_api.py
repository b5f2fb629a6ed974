"""TF Serving's REST API (model_servers/http_rest_api_handler.cc) on Python's threading HTTP server:
model status, metadata and predict in both JSON request formats, plus the Prometheus metrics path.

Bodies are the protos' JSON with the protos' field names; errors are `{"error": message}` with the HTTP
status TF Serving maps the gRPC code to.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import numpy as np
from google.protobuf import json_format

from trainserve.layout import DEFAULT_SIGNATURE
from trainserve.protos.get_model_status_pb2 import ModelVersionStatus
from trainserve.serving.manager import VersionState
from trainserve.serving.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from trainserve.serving.metrics import prometheus_text
from trainserve.serving.servables import Servables, ServingError

log = logging.getLogger(__name__)

URL = re.compile(
    r"^/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>\d+)|/labels/(?P<label>[^/:]+))?"
    r"(?P<verb>/metadata|:predict|:classify|:regress)?/?$"
)
# gRPC code -> HTTP status as TF Serving maps them (ToHTTPStatusCode, model_servers/http_server.cc);
# codes not listed here answer 500.
HTTP_STATUS = {
    grpc.StatusCode.NOT_FOUND: HTTPStatus.NOT_FOUND,
    grpc.StatusCode.INVALID_ARGUMENT: HTTPStatus.BAD_REQUEST,
    grpc.StatusCode.FAILED_PRECONDITION: HTTPStatus.BAD_REQUEST,
    grpc.StatusCode.UNIMPLEMENTED: HTTPStatus.NOT_IMPLEMENTED,
    grpc.StatusCode.UNAVAILABLE: HTTPStatus.SERVICE_UNAVAILABLE,
}


def json_value(array: np.ndarray):
    """An output array as JSON; bytes (DT_STRING) are decoded as UTF-8 text."""
    if array.dtype == object:  # keeps the shape: a [N, K] string output is N rows of K strings, as in TF Serving
        return np.vectorize(_text, otypes=[object])(array).tolist()
    return array.tolist()


def _text(value):
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def rest_inputs(body: dict, inputs_spec: dict) -> tuple[dict[str, np.ndarray], bool]:
    """Row (`instances`) or columnar (`inputs`) request body -> (arrays in the signature's dtypes, row?)."""
    if ("instances" in body) == ("inputs" in body):
        raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, 'expected exactly one of "instances" or "inputs"')
    if "instances" in body:
        return _row_inputs(body["instances"], inputs_spec), True
    return _columnar_inputs(body["inputs"], inputs_spec), False


def _row_inputs(instances, inputs_spec: dict) -> dict[str, np.ndarray]:
    """A list of instances: bare values for a single-input signature, else objects keyed by input."""
    names = sorted(inputs_spec)
    if not isinstance(instances, list):
        raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, '"instances" must be a list')
    if len(names) == 1 and not (instances and isinstance(instances[0], dict)):
        return {names[0]: _input_array(inputs_spec, names[0], instances)}
    if not all(isinstance(i, dict) for i in instances):
        raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, f"each instance must be an object with keys {names}")
    keys = set().union(*(i.keys() for i in instances)) if instances else set(names)
    return {k: _input_array(inputs_spec, k, [i.get(k) for i in instances]) for k in keys}


def _columnar_inputs(columns, inputs_spec: dict) -> dict[str, np.ndarray]:
    """An object of whole input tensors, or one bare tensor for a single-input signature."""
    names = sorted(inputs_spec)
    if isinstance(columns, dict):
        return {k: _input_array(inputs_spec, k, v) for k, v in columns.items()}
    if len(names) != 1:
        raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, f'"inputs" must be an object with keys {names}')
    return {names[0]: _input_array(inputs_spec, names[0], columns)}


def _input_array(inputs_spec: dict, key: str, value) -> np.ndarray:
    spec = inputs_spec.get(key)
    if spec is None:
        raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, f"unknown input {key!r}: expected {sorted(inputs_spec)}")
    try:
        return np.asarray(value, dtype=spec.dtype)
    except (ValueError, TypeError, OverflowError) as exc:
        raise ServingError(
            grpc.StatusCode.INVALID_ARGUMENT, f"input {key!r}: {exc}: expected {spec.describe()}"
        ) from None


def predict_json(outputs: dict[str, np.ndarray], row: bool) -> dict:
    """The answer in the request's format: `predictions` (one per instance) or columnar `outputs`;
    a single output is written bare, without its name."""
    if row:
        if len(outputs) == 1:
            return {"predictions": json_value(next(iter(outputs.values())))}
        columns = {k: json_value(v) for k, v in outputs.items()}
        count = len(next(iter(columns.values())))
        return {"predictions": [{k: v[i] for k, v in columns.items()} for i in range(count)]}
    if len(outputs) == 1:
        return {"outputs": json_value(next(iter(outputs.values())))}
    return {"outputs": {k: json_value(v) for k, v in outputs.items()}}


def status_json(states: list[VersionState]) -> dict:
    """GetModelStatusResponse as JSON: versions as strings, states by name (as TF Serving prints them)."""
    return {
        "model_version_status": [
            {
                "version": str(s.version),
                "state": ModelVersionStatus.State.Name(s.state),
                "status": {"error_code": s.error_code, "error_message": s.error_message},
            }
            for s in states
        ]
    }


def metadata_json(name: str, version: int, signature_map) -> dict:
    return {
        "model_spec": {"name": name, "signature_name": "", "version": str(version)},
        "metadata": {"signature_def": json_format.MessageToDict(signature_map, preserving_proto_field_name=True)},
    }


def parse_json_body(raw: bytes) -> dict:
    try:
        body = json.loads(raw or b"{}")
    except ValueError as exc:
        raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, f"JSON parse error: {exc}") from None
    if not isinstance(body, dict):
        raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, "expected a JSON object body")
    return body


class RestHandler(BaseHTTPRequestHandler):
    """One HTTP request; make_rest_handler binds the servables and the metrics path to a subclass."""

    servables: Servables
    metrics_path: str | None = None
    server_version = "trainserve-serve-local"
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # access logs only when debugging
        log.debug("%s %s", self.address_string(), fmt % args)

    def _send(self, status: int, payload, content_type="application/json"):
        body = payload if isinstance(payload, bytes) else (json.dumps(payload) + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _route(self):
        match = URL.match(self.path.split("?")[0])
        if not match:
            raise ServingError(grpc.StatusCode.NOT_FOUND, f"Malformed request: {self.command} {self.path}")
        version = int(match["version"]) if match["version"] else None
        return match["name"], version, match["label"], match["verb"] or ""

    def _handle(self, method):
        try:
            method()
        except ServingError as exc:
            self._send(HTTP_STATUS.get(exc.code, HTTPStatus.INTERNAL_SERVER_ERROR), {"error": str(exc)})

    def do_GET(self):
        if self.metrics_path and self.path.split("?")[0] == self.metrics_path:
            servables = self.servables
            text = prometheus_text(servables.metrics, servables.manager, batching=servables.batching is not None)
            return self._send(200, text.encode(), METRICS_CONTENT_TYPE)
        self._handle(self._get)

    def _get(self):
        name, version, label, verb = self._route()
        if verb == "/metadata":
            version, signature_map = self.servables.metadata(name, version, label, entrypoint="REST")
            return self._send(200, metadata_json(name, version, signature_map))
        if verb:
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, f"{verb} needs POST")
        # /labels/{l} lists every version: TF Serving's handler puts the label in the ModelSpec and GetModelStatus
        # ignores it (http_rest_api_handler.cc, get_model_status_impl.cc); /labels/{l}/metadata resolves it.
        return self._send(200, status_json(self.servables.status(name, version, label, entrypoint="REST")))

    def do_POST(self):
        self._handle(self._post)

    def _post(self):
        name, version, label, verb = self._route()
        # Read the body even when the request fails: the connection is kept alive (HTTP/1.1).
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if verb in (":classify", ":regress"):
            raise ServingError(grpc.StatusCode.UNIMPLEMENTED, f"serve-local does not implement {verb}")
        if verb != ":predict":
            raise ServingError(grpc.StatusCode.NOT_FOUND, f"Malformed request: POST {self.path}")
        body = parse_json_body(raw)
        signature = body.get("signature_name") or DEFAULT_SIGNATURE
        # Resolve once and predict on that version: the JSON is converted with its signature's dtypes.
        state = self.servables.resolve(name, version, label)
        inputs, row = rest_inputs(body, self.servables.inputs_spec(state, signature))
        _, _, outputs = self.servables.predict(name, state.version, None, signature, inputs, entrypoint="REST")
        return self._send(200, predict_json(outputs, row))


def make_rest_handler(servables: Servables, metrics_path: str | None) -> type[RestHandler]:
    """A handler class bound to `servables` (and serving metrics at `metrics_path` when set):
    http.server builds one handler per request from a class, so the bindings are class attributes."""
    return type("Handler", (RestHandler,), {"servables": servables, "metrics_path": metrics_path})


def start_rest_server(servables: Servables, port: int, metrics_path: str | None) -> ThreadingHTTPServer:
    """The REST API on 0.0.0.0:`port` (0: any free port, see .server_address), serving from a background thread."""
    server = ThreadingHTTPServer(("0.0.0.0", port), make_rest_handler(servables, metrics_path))
    server.daemon_threads = False  # server_close() then waits for in-flight requests
    threading.Thread(target=server.serve_forever, name="rest", daemon=True).start()
    return server
