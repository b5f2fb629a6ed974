"""TF Serving's REST API (model_servers/http_rest_api_handler.cc) on Python's threading HTTP server:
model status, metadata and predict in both JSON request formats, plus the Prometheus metrics path.

Bodies are the protos' JSON with the protos' field names; errors are `{"error": message}` with the HTTP
status TF Serving maps the gRPC code to.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import re
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import numpy as np
from google.protobuf import json_format

from trainserve.errors import first_line
from trainserve.exposition import CONTENT_TYPE
from trainserve.layout import DEFAULT_SIGNATURE
from trainserve.protos import predict_pb2
from trainserve.protos.get_model_status_pb2 import ModelVersionStatus
from trainserve.serving.capture import Capture
from trainserve.serving.grpc_api import predict_response
from trainserve.serving.manager import VersionState
from trainserve.serving.metrics import prometheus_text
from trainserve.serving.rest_json import rest_inputs
from trainserve.serving.servables import Servables, ServingError
from trainserve.tensors import to_tensor_proto
from trainserve.traffic.origin import origin_of
from trainserve.traffic.records import REQUEST_ID_HEADER

log = logging.getLogger(__name__)

URL = re.compile(
    r"^/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>\d+)|/labels/(?P<label>[^/:]+))?"
    r"(?P<verb>/metadata|:predict|:classify|:regress)?/?$"
)
# gRPC code -> HTTP status, every code as TF Serving maps them (ToHTTPStatusCode, model_servers/http_server.cc).
HTTP_STATUS = {
    grpc.StatusCode.CANCELLED: 499,  # nginx's "client closed request"
    grpc.StatusCode.UNKNOWN: HTTPStatus.INTERNAL_SERVER_ERROR,
    grpc.StatusCode.INVALID_ARGUMENT: HTTPStatus.BAD_REQUEST,
    grpc.StatusCode.DEADLINE_EXCEEDED: HTTPStatus.GATEWAY_TIMEOUT,
    grpc.StatusCode.NOT_FOUND: HTTPStatus.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS: HTTPStatus.CONFLICT,
    grpc.StatusCode.PERMISSION_DENIED: HTTPStatus.FORBIDDEN,
    grpc.StatusCode.RESOURCE_EXHAUSTED: HTTPStatus.TOO_MANY_REQUESTS,
    grpc.StatusCode.FAILED_PRECONDITION: HTTPStatus.BAD_REQUEST,
    grpc.StatusCode.ABORTED: HTTPStatus.CONFLICT,
    grpc.StatusCode.OUT_OF_RANGE: HTTPStatus.BAD_REQUEST,
    grpc.StatusCode.UNIMPLEMENTED: HTTPStatus.NOT_IMPLEMENTED,
    grpc.StatusCode.INTERNAL: HTTPStatus.INTERNAL_SERVER_ERROR,
    grpc.StatusCode.UNAVAILABLE: HTTPStatus.SERVICE_UNAVAILABLE,
    grpc.StatusCode.DATA_LOSS: HTTPStatus.INTERNAL_SERVER_ERROR,
    grpc.StatusCode.UNAUTHENTICATED: HTTPStatus.UNAUTHORIZED,
}
BYTES_SUFFIX = "_bytes"  # DT_STRING outputs named so are always written as base64, as in TF Serving


def json_value(array: np.ndarray, name: str = ""):
    """An output array as JSON. DT_STRING values are text when they are UTF-8 (and `name` does not end in
    _bytes), else {"b64": ...}: JSON strings cannot hold arbitrary bytes."""
    # DT_STRING arrives as objects, or as fixed-width bytes (a scalar string output): both are written as strings,
    # keeping the shape (a [N, K] string output is N rows of K strings, as in TF Serving).
    if array.dtype == object or array.dtype.kind == "S":
        as_b64 = name.endswith(BYTES_SUFFIX)
        return np.vectorize(lambda v: json_string(v, as_b64), otypes=[object])(array).tolist()
    return array.tolist()


def json_string(value, as_b64: bool):
    """One DT_STRING value as JSON: text, or {"b64": ...} when asked or when the bytes are not UTF-8."""
    if not isinstance(value, bytes):
        return value
    if not as_b64:
        try:
            return value.decode()
        except UnicodeDecodeError:
            pass
    return {"b64": base64.b64encode(value).decode()}


def predict_json(outputs: dict[str, np.ndarray], row: bool) -> dict:
    """The answer in the request's format: `predictions` (one per instance) or columnar `outputs`;
    a single output is written bare, without its name."""
    if not row:
        if len(outputs) == 1:
            return {"outputs": json_value(*_only(outputs))}
        return {"outputs": {k: json_value(v, k) for k, v in outputs.items()}}
    count = _batch_size(outputs)
    if len(outputs) == 1:
        return {"predictions": json_value(*_only(outputs))}
    columns = {k: json_value(v, k) for k, v in outputs.items()}
    return {"predictions": [{k: v[i] for k, v in columns.items()} for i in range(count)]}


def _only(outputs: dict[str, np.ndarray]) -> tuple[np.ndarray, str]:
    name, array = next(iter(outputs.items()))
    return array, name


def _batch_size(outputs: dict[str, np.ndarray]) -> int:
    """Rows need one batch size across the outputs (MakeRowFormatJsonFromTensors): else INVALID_ARGUMENT."""
    sizes = {k: v.shape[0] if v.ndim else None for k, v in outputs.items()}
    for key, size in sizes.items():
        if size is None:
            raise ServingError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f'output {key!r} has no batch dimension: ask for "inputs" (columnar) to get it',
            )
    if len(set(sizes.values())) > 1:
        raise ServingError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f'outputs have different batch sizes {sizes}: expected one, or ask for "inputs" (columnar)',
        )
    return next(iter(sizes.values()))


def grpc_wire(asked: tuple, inputs: dict, answered: tuple, outputs: dict) -> tuple[bytes, bytes]:
    """A REST predict as the gRPC PredictRequest that asks the same (name, version or label, signature; inputs as
    converted with the signature's dtypes) and the PredictResponse gRPC would have answered: what capture records."""
    name, version, label, signature = asked
    request = predict_pb2.PredictRequest()
    request.model_spec.name, request.model_spec.signature_name = name, signature
    if version is not None:
        request.model_spec.version.SetInParent()
        request.model_spec.version.value = version
    elif label is not None:
        request.model_spec.version_label = label
    for key, value in inputs.items():
        to_tensor_proto(value, into=request.inputs[key])
    return request.SerializeToString(), predict_response(*answered, outputs).SerializeToString()


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
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the parser recurses
        raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, f"JSON parse error: {first_line(exc)}") from None
    if not isinstance(body, dict):
        raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, "the body is not a JSON object: expected one")
    signature = body.get("signature_name", "")
    if not isinstance(signature, str):
        raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, '"signature_name" is not a string: expected one')
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
        except Exception as exc:  # a fault of ours: the client still gets an answer, the log the traceback
            log.exception("REST %s %s failed", self.command, self.path)
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"internal error: {first_line(exc)}"})

    def do_GET(self):
        if self.metrics_path and self.path.split("?")[0] == self.metrics_path:
            servables = self.servables
            text = prometheus_text(servables.metrics, servables.manager, batching=servables.batching is not None)
            capture = servables.capture  # read once: a config reload may swap it
            if capture is not None:
                text += "\n".join(capture.prometheus_lines()) + "\n"
            return self._send(200, text.encode(), CONTENT_TYPE)
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

    def _read_body(self) -> bytes:
        """Read even when the request fails: the connection is kept alive (HTTP/1.1)."""
        length = self.headers.get("Content-Length") or "0"
        if not length.isdigit():
            self.close_connection = True  # the body's end is unknown: the connection cannot carry another request
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, f"Content-Length {length!r}: expected a size in bytes")
        return self.rfile.read(int(length))

    def _post(self):
        name, version, label, verb = self._route()
        raw = self._read_body()
        if verb in (":classify", ":regress"):
            raise ServingError(grpc.StatusCode.UNIMPLEMENTED, f"serve-local does not implement {verb}")
        if verb != ":predict":
            raise ServingError(grpc.StatusCode.NOT_FOUND, f"Malformed request: POST {self.path}")
        body = parse_json_body(raw)
        signature = body.get("signature_name") or DEFAULT_SIGNATURE
        sampled = self.servables.sample(name, origin_of(self.headers.items()))
        inputs: dict[str, np.ndarray] = {}

        def to_inputs(spec) -> dict[str, np.ndarray]:
            inputs.update(rest_inputs(body, spec)[0])
            return inputs

        # The JSON is converted with the resolved version's dtypes, inside the request's bookkeeping.
        answered, signature, outputs = self.servables.predict(name, version, label, signature, to_inputs)
        answer = (json.dumps(predict_json(outputs, "instances" in body)) + "\n").encode()  # may fail: then unrecorded
        if sampled is not None:
            asked = (name, version, label, body.get("signature_name", ""))
            wire = functools.partial(grpc_wire, asked, inputs, (name, answered, signature), outputs)
            Capture.log(sampled, (name, answered, signature), wire, self.headers.get(REQUEST_ID_HEADER))
        return self._send(200, answer)


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
