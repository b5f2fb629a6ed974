"""serve-local: an embedded stand-in for tensorflow_model_server, speaking its gRPC and REST APIs.

Same flag names, model directory rules, version policies, labels, warmup, status codes and response
encoding as TF Serving (see SERVING_FACTS.md). Where it differs, the README says so. The one deliberate
improvement: SIGTERM stops accepting, finishes in-flight requests and exits 0.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import socket
import threading
import time
from collections import Counter
from concurrent import futures
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import numpy as np
from google.protobuf import json_format, wrappers_pb2
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from trainserve.errors import TrainserveError, first_line
from trainserve.layout import DEFAULT_SIGNATURE
from trainserve.savedmodel import UnknownSignature
from trainserve.serving.config import (
    Batching,
    ServerOptions,
    parse_batching,
    parse_model_config,
    parse_monitoring,
    single_model_config,
)
from trainserve.serving.manager import ModelManager, NotFound, VersionState
from trainserve.tensors import from_tensor_proto, to_tensor_proto

log = logging.getLogger("trainserve.serving.server")

MAX_MESSAGE = 2**31 - 1  # TF Serving's gRPC limit (INT32_MAX)
STATE_CODES = {"UNKNOWN": 0, "START": 10, "LOADING": 20, "AVAILABLE": 30, "UNLOADING": 40, "END": 50}
HTTP_STATUS = {
    grpc.StatusCode.NOT_FOUND: HTTPStatus.NOT_FOUND,
    grpc.StatusCode.INVALID_ARGUMENT: HTTPStatus.BAD_REQUEST,
    grpc.StatusCode.FAILED_PRECONDITION: HTTPStatus.BAD_REQUEST,
    grpc.StatusCode.UNIMPLEMENTED: HTTPStatus.NOT_IMPLEMENTED,
    grpc.StatusCode.UNAVAILABLE: HTTPStatus.SERVICE_UNAVAILABLE,
}


class ServingError(Exception):
    """A request failure with the gRPC status TF Serving would give it."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


class Servables:
    """What both APIs call: resolve a model spec, check inputs, run, count."""

    def __init__(self, manager: ModelManager, batching: Batching | None):
        self.manager, self.batching = manager, batching
        self.requests: Counter[tuple[str, str, str]] = Counter()
        self._inflight = 0
        self._lock = threading.Lock()

    def resolve(self, name: str, version: int | None, label: str | None) -> VersionState:
        try:
            return self.manager.get(name).resolve(version, label)
        except NotFound as exc:
            raise ServingError(grpc.StatusCode.NOT_FOUND, str(exc)) from None

    def predict(self, name, version, label, signature, inputs, output_filter=()):
        """Returns (version, signature name, outputs)."""
        signature = signature or DEFAULT_SIGNATURE
        with self._track(name, "predict"):
            state = self.resolve(name, version, label)
            if self.batching is not None:
                sizes = {v.shape[0] for v in inputs.values() if v.ndim}
                if sizes and max(sizes) > self.batching.max_batch_size:
                    raise ServingError(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"Task size {max(sizes)} is larger than maximum input batch size "
                        f"{self.batching.max_batch_size}",
                    )
            try:
                outputs = state.model.run(signature, inputs, list(output_filter) or None)
            except UnknownSignature:
                raise ServingError(
                    grpc.StatusCode.FAILED_PRECONDITION, f'Serving signature key "{signature}" not found.'
                ) from None
            except TrainserveError as exc:
                raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
            except Exception as exc:  # a TF runtime error inside the graph
                raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, first_line(exc)) from None
            return state.version, signature, outputs

    def metadata(self, name, version, label) -> tuple[int, get_model_metadata_pb2.SignatureDefMap]:
        with self._track(name, "metadata"):
            state = self.resolve(name, version, label)
            return state.version, get_model_metadata_pb2.SignatureDefMap(signature_def=state.model.signature_defs)

    def status(self, name, version, label) -> list[VersionState]:
        with self._track(name, "status"):
            try:
                model = self.manager.get(name)
                if label:
                    version = model.resolve(None, label).version
            except NotFound as exc:
                raise ServingError(grpc.StatusCode.NOT_FOUND, str(exc)) from None
            states = sorted(model.versions.values(), key=lambda s: s.version)
            if version is not None:
                states = [s for s in states if s.version == version]
            if not states:
                what = f"version {version} of model {name}" if version is not None else f"any versions of model {name}"
                raise ServingError(grpc.StatusCode.NOT_FOUND, f"Could not find {what}")
            return states

    @contextlib.contextmanager
    def _track(self, name: str, api: str):
        """Count the request while it runs (for the drain log) and by outcome afterwards (for metrics)."""
        with self._lock:
            self._inflight += 1
        status = "OK"
        try:
            yield
        except ServingError as exc:
            status = exc.code.name
            raise
        except BaseException:
            status = "UNKNOWN"
            raise
        finally:
            with self._lock:
                self._inflight -= 1
                self.requests[(name, api, status)] += 1

    @property
    def inflight(self) -> int:
        return self._inflight

    def prometheus(self) -> str:
        lines = ["# TYPE :tensorflow:serving:request_count counter"]
        for (name, api, status), count in sorted(self.requests.items()):
            lines.append(
                f':tensorflow:serving:request_count{{model_name="{name}",api="{api}",status="{status}"}} {count}'
            )
        lines.append("# TYPE :trainserve:serve_local:available_versions gauge")
        for name, model in sorted(self.manager.models.items()):
            lines.append(f':trainserve:serve_local:available_versions{{model_name="{name}"}} {len(model.available())}')
        return "\n".join(lines) + "\n"


def _spec(model_spec) -> tuple[str, int | None, str | None]:
    choice = model_spec.WhichOneof("version_choice")
    version = model_spec.version.value if choice == "version" else None
    label = model_spec.version_label if choice == "version_label" else None
    return model_spec.name, version, label


def _abort(context, exc: ServingError):
    context.abort(exc.code, str(exc))


class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, servables: Servables):
        self.servables = servables

    def Predict(self, request, context):
        name, version, label = _spec(request.model_spec)
        try:
            inputs = {k: from_tensor_proto(v) for k, v in request.inputs.items()}
            version, signature, outputs = self.servables.predict(
                name, version, label, request.model_spec.signature_name, inputs, request.output_filter
            )
        except TrainserveError as exc:
            _abort(context, ServingError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)))
        except ServingError as exc:
            _abort(context, exc)
        response = predict_pb2.PredictResponse(
            model_spec=model_pb2.ModelSpec(
                name=name, version=wrappers_pb2.Int64Value(value=version), signature_name=signature
            )
        )
        for key, value in outputs.items():
            response.outputs[key].CopyFrom(to_tensor_proto(value, as_values=True))
        return response

    def GetModelMetadata(self, request, context):
        name, version, label = _spec(request.model_spec)
        unsupported = [f for f in request.metadata_field if f != "signature_def"]
        if unsupported or not request.metadata_field:
            _abort(
                context,
                ServingError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"Metadata field {unsupported[0] if unsupported else '(none)'} is not supported: "
                    "expected signature_def",
                ),
            )
        try:
            version, signature_map = self.servables.metadata(name, version, label)
        except ServingError as exc:
            _abort(context, exc)
        response = get_model_metadata_pb2.GetModelMetadataResponse(
            model_spec=model_pb2.ModelSpec(name=name, version=wrappers_pb2.Int64Value(value=version))
        )
        response.metadata["signature_def"].Pack(signature_map)
        return response

    def _unimplemented(self, request, context):
        _abort(
            context,
            ServingError(
                grpc.StatusCode.UNIMPLEMENTED,
                "serve-local implements Predict and GetModelMetadata only; use tensorflow_model_server for "
                "Classify, Regress and MultiInference",
            ),
        )

    Classify = Regress = MultiInference = _unimplemented


class ModelService(model_service_pb2_grpc.ModelServiceServicer):
    def __init__(self, servables: Servables):
        self.servables = servables

    def GetModelStatus(self, request, context):
        try:
            states = self.servables.status(*_spec(request.model_spec))
        except ServingError as exc:
            _abort(context, exc)
        response = get_model_status_pb2.GetModelStatusResponse()
        for state in states:
            status = response.model_version_status.add(version=state.version, state=STATE_CODES[state.state])
            status.status.error_code = 0 if state.error_code == "OK" else 2  # tensorflow.error.Code UNKNOWN
            status.status.error_message = state.error_message
        return response

    def HandleReloadConfigRequest(self, request, context):
        _abort(context, ServingError(grpc.StatusCode.UNIMPLEMENTED, "serve-local reloads by polling its config file"))


URL = re.compile(
    r"^/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>\d+)|/labels/(?P<label>[^/:]+))?"
    r"(?P<verb>/metadata|:predict|:classify|:regress)?/?$"
)


def _json_value(array: np.ndarray):
    if array.dtype == object:
        return [v.decode(errors="replace") if isinstance(v, bytes) else v for v in array.ravel()]
    return array.tolist()


def _rest_inputs(body: dict, inputs_spec: dict) -> tuple[dict[str, np.ndarray], bool]:
    """Row (`instances`) or columnar (`inputs`) request body -> arrays in the signature's dtypes."""
    if ("instances" in body) == ("inputs" in body):
        raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, 'expected exactly one of "instances" or "inputs"')
    row = "instances" in body
    names = sorted(inputs_spec)

    def array(key, value):
        spec = inputs_spec.get(key)
        if spec is None:
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, f"unknown input {key!r}: expected {names}")
        try:
            return np.asarray(value, dtype=spec.dtype)
        except (ValueError, TypeError, OverflowError) as exc:
            raise ServingError(
                grpc.StatusCode.INVALID_ARGUMENT, f"input {key!r}: {exc}: expected {spec.describe()}"
            ) from None

    if row:
        instances = body["instances"]
        if not isinstance(instances, list):
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, '"instances" must be a list')
        if len(names) == 1 and not (instances and isinstance(instances[0], dict)):
            return {names[0]: array(names[0], instances)}, True
        if not all(isinstance(i, dict) for i in instances):
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, f"each instance must be an object with keys {names}")
        keys = set().union(*(i.keys() for i in instances)) if instances else set(names)
        return {k: array(k, [i.get(k) for i in instances]) for k in keys}, True
    columns = body["inputs"]
    if isinstance(columns, dict):
        return {k: array(k, v) for k, v in columns.items()}, False
    if len(names) != 1:
        raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, f'"inputs" must be an object with keys {names}')
    return {names[0]: array(names[0], columns)}, False


def make_rest_handler(servables: Servables, metrics_path: str | None):
    class Handler(BaseHTTPRequestHandler):
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
            if metrics_path and self.path.split("?")[0] == metrics_path:
                return self._send(200, servables.prometheus().encode(), "text/plain; version=0.0.4")
            self._handle(self._get)

        def _get(self):
            name, version, label, verb = self._route()
            if verb == "/metadata":
                version, signature_map = servables.metadata(name, version, label)
                return self._send(
                    200,
                    {
                        "model_spec": {"name": name, "signature_name": "", "version": str(version)},
                        "metadata": {
                            "signature_def": json_format.MessageToDict(signature_map, preserving_proto_field_name=True)
                        },
                    },
                )
            if verb:
                raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, f"{verb} needs POST")
            states = servables.status(name, version, label)
            return self._send(
                200,
                {
                    "model_version_status": [
                        {
                            "version": str(s.version),
                            "state": s.state,
                            "status": {"error_code": s.error_code, "error_message": s.error_message},
                        }
                        for s in states
                    ]
                },
            )

        def do_POST(self):
            self._handle(self._post)

        def _post(self):
            name, version, label, verb = self._route()
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            if verb in (":classify", ":regress"):
                raise ServingError(grpc.StatusCode.UNIMPLEMENTED, f"serve-local does not implement {verb}")
            if verb != ":predict":
                raise ServingError(grpc.StatusCode.NOT_FOUND, f"Malformed request: POST {self.path}")
            try:
                body = json.loads(raw or b"{}")
            except ValueError as exc:
                raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, f"JSON parse error: {exc}") from None
            if not isinstance(body, dict):
                raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, "expected a JSON object body")
            signature = body.get("signature_name") or DEFAULT_SIGNATURE
            state = servables.resolve(name, version, label)
            try:
                inputs_spec, _ = state.model.signature(signature)
            except UnknownSignature:
                raise ServingError(
                    grpc.StatusCode.FAILED_PRECONDITION, f'Serving signature key "{signature}" not found.'
                ) from None
            inputs, row = _rest_inputs(body, inputs_spec)
            _, _, outputs = servables.predict(name, state.version, None, signature, inputs)
            if row:
                if len(outputs) == 1:
                    predictions = _json_value(next(iter(outputs.values())))
                else:
                    columns = {k: _json_value(v) for k, v in outputs.items()}
                    count = len(next(iter(columns.values())))
                    predictions = [{k: v[i] for k, v in columns.items()} for i in range(count)]
                return self._send(200, {"predictions": predictions})
            if len(outputs) == 1:
                return self._send(200, {"outputs": _json_value(next(iter(outputs.values())))})
            return self._send(200, {"outputs": {k: _json_value(v) for k, v in outputs.items()}})

    return Handler


def check_port_free(port: int, what: str) -> None:
    """Fail at start, with the flag's name, when a port is taken (TF Serving would die later, less clearly)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("0.0.0.0", port))
        except OSError as exc:
            raise TrainserveError(f"{what} {port} is not available ({exc.strerror}): expected a free port") from None


def serve(options: ServerOptions, stop: threading.Event | None = None) -> int:
    """Run until SIGTERM/SIGINT (or `stop` is set); returns the exit code."""
    config = load_config(options)
    if options.batching_parameters_file and not options.enable_batching:
        raise TrainserveError("--batching_parameters_file is set but --enable_batching is not: expected both")
    batching = (
        parse_batching(Path(options.batching_parameters_file) if options.batching_parameters_file else None)
        if options.enable_batching
        else None
    )
    metrics_path = parse_monitoring(Path(options.monitoring_config_file) if options.monitoring_config_file else None)
    if metrics_path and not options.rest_api_port:
        raise TrainserveError("--monitoring_config_file needs --rest_api_port: metrics are served on the REST port")
    if options.port == options.rest_api_port:
        raise TrainserveError(f"--port and --rest_api_port are both {options.port}: expected different ports")
    if options.port:
        check_port_free(options.port, "--port")
    if options.rest_api_port:
        check_port_free(options.rest_api_port, "--rest_api_port")

    stop = stop or threading.Event()
    signals = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signals[signum] = signal.signal(signum, lambda num, frame: _request_stop(stop, num))

    manager = ModelManager(
        options.tensorflow_intra_op_parallelism, options.tensorflow_inter_op_parallelism, options.enable_model_warmup
    )
    manager.configure(config)
    poll_seconds = max(options.file_system_poll_wait_seconds, 0.2)
    log.info("waiting for %s to become AVAILABLE (ports open then)", ", ".join(sorted(manager.models)))
    if not manager.wait_until_available(poll_seconds, stop):
        log.info("stopped before any model was available")
        return 0

    servables = Servables(manager, batching)
    cpus = max(1, len(_affinity()))
    grpc_server = None
    if options.port:
        grpc_server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=options.grpc_max_threads or 4 * cpus),
            options=[("grpc.max_receive_message_length", MAX_MESSAGE), ("grpc.max_send_message_length", MAX_MESSAGE)],
        )
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(PredictionService(servables), grpc_server)
        model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelService(servables), grpc_server)
        if grpc_server.add_insecure_port(f"0.0.0.0:{options.port}") == 0:
            raise TrainserveError(f"--port {options.port} could not be bound: expected a free port")
        grpc_server.start()
        log.info("Running gRPC ModelServer at 0.0.0.0:%d ...", options.port)
    http_server = None
    if options.rest_api_port:
        http_server = ThreadingHTTPServer(
            ("0.0.0.0", options.rest_api_port), make_rest_handler(servables, metrics_path)
        )
        http_server.daemon_threads = False  # server_close() then waits for in-flight requests
        threading.Thread(target=http_server.serve_forever, name="rest", daemon=True).start()
        log.info("Exporting HTTP/REST API at:localhost:%d ...", options.rest_api_port)

    poller = threading.Thread(target=_poll_loop, args=(manager, options, stop, poll_seconds), daemon=True)
    poller.start()
    stop.wait()
    log.info("stopping: no new requests; finishing %d in-flight request(s)", servables.inflight)
    if http_server is not None:
        http_server.shutdown()
    if grpc_server is not None:
        grpc_server.stop(grace=options.rest_api_timeout_in_ms / 1000).wait()
    if http_server is not None:
        http_server.server_close()
    poller.join(timeout=5)
    manager.close()
    for signum, handler in signals.items():
        signal.signal(signum, handler)
    log.info("stopped cleanly")
    return 0


def _request_stop(stop: threading.Event, signum: int) -> None:
    log.info("received %s", signal.Signals(signum).name)
    stop.set()


def _affinity() -> set[int]:
    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))


def load_config(options: ServerOptions):
    if options.model_config_file:
        return parse_model_config(Path(options.model_config_file))
    if not options.model_base_path:
        raise TrainserveError("expected --model_base_path (with --model_name) or --model_config_file")
    return single_model_config(options.model_name, options.model_base_path)


def _poll_loop(manager: ModelManager, options: ServerOptions, stop: threading.Event, poll_seconds: float) -> None:
    reload_every = options.model_config_file_poll_wait_seconds if options.model_config_file else 0
    next_config = time.monotonic() + reload_every
    while not stop.wait(poll_seconds):
        if reload_every > 0 and time.monotonic() >= next_config:
            next_config = time.monotonic() + reload_every
            try:
                manager.configure(load_config(options))
            except TrainserveError as exc:
                log.error("model config not reloaded, keeping the current one: %s", exc)
        try:
            manager.poll()
        except Exception:  # a poll must never take the server down
            log.exception("polling the model directories failed; retrying")
