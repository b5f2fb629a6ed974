"""TF Serving's gRPC API on grpc.aio: PredictionService (Predict, GetModelMetadata) and ModelService
(GetModelStatus), with TF Serving's messages from trainserve.protos.

One event loop, on a thread of its own, answers every RPC: a request costs a coroutine, not a thread
hand-off, and waits for its batch without holding a thread (servables.predict_async). Classify, Regress,
MultiInference and HandleReloadConfigRequest answer UNIMPLEMENTED with a message that says what to use
instead.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from concurrent import futures

import grpc

from trainserve.errors import TrainserveError
from trainserve.protos import get_model_metadata_pb2, get_model_status_pb2, predict_pb2
from trainserve.protos.model_service_pb2_grpc import add_ModelServiceServicer_to_server
from trainserve.protos.prediction_service_pb2_grpc import add_PredictionServiceServicer_to_server
from trainserve.serving.capture import Capture
from trainserve.serving.health import health_handler
from trainserve.serving.servables import Servables, ServingError
from trainserve.tensors import from_tensor_proto, to_tensor_proto
from trainserve.traffic.origin import origin_of
from trainserve.traffic.records import REQUEST_ID_HEADER

MAX_MESSAGE = 2**31 - 1  # TF Serving's gRPC message limit, both ways (INT32_MAX, model_servers/server.cc)
ERROR_CODE_UNKNOWN = 2  # tensorflow.error.Code UNKNOWN: what a failed load reports in its status


def parse_model_spec(model_spec) -> tuple[str, int | None, str | None]:
    """(name, version, label); a set version is taken as asked, even 0 (ServerCore::ServableRequestFromModelSpec)."""
    choice = model_spec.WhichOneof("version_choice")
    version = model_spec.version.value if choice == "version" else None
    label = model_spec.version_label if choice == "version_label" else None
    return model_spec.name, version, label


def decode_inputs(request) -> dict:
    """The request's tensors as numpy arrays; one that cannot be decoded is INVALID_ARGUMENT naming its key
    (TF Serving says "tensor parsing error: KEY"; we add what was wrong)."""
    arrays = {}
    for key, proto in request.inputs.items():
        try:
            arrays[key] = from_tensor_proto(proto)
        except TrainserveError as exc:
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, f"tensor parsing error: {key}: {exc}") from None
    return arrays


def fill_model_spec(model_spec, name: str, version: int, signature: str = "") -> None:
    model_spec.name, model_spec.signature_name = name, signature
    model_spec.version.SetInParent()  # present even for version 0
    model_spec.version.value = version


def predict_response(name: str, version: int, signature: str, outputs: dict) -> predict_pb2.PredictResponse:
    response = predict_pb2.PredictResponse()
    fill_model_spec(response.model_spec, name, version, signature)
    for key, value in outputs.items():
        # *_val fields, not tensor_content: what TF Serving sends by default (tensorflow/serving#1276).
        to_tensor_proto(value, as_values=True, into=response.outputs[key])
    return response


def serialized(request, response) -> tuple[bytes, bytes]:
    """A call's messages as gRPC sends them (SerializeToString is the generated stubs' serializer)."""
    return request.SerializeToString(), response.SerializeToString()


def metadata_value(context, key: str) -> str | None:
    """A request's gRPC metadata value under `key` (lower case), if the client sent one."""
    return next((value for k, value in context.invocation_metadata() or () if k == key), None)


def check_metadata_fields(fields) -> None:
    """GetModelMetadata answers signature_def only, as TF Serving does."""
    unsupported = [f for f in fields if f != "signature_def"]
    if unsupported or not fields:
        raise ServingError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"Metadata field {unsupported[0] if unsupported else '(none)'} is not supported: expected signature_def",
        )


def status_response(states) -> get_model_status_pb2.GetModelStatusResponse:
    response = get_model_status_pb2.GetModelStatusResponse()
    for state in states:
        status = response.model_version_status.add(version=state.version, state=state.state)
        status.status.error_code = 0 if state.error_code == "OK" else ERROR_CODE_UNKNOWN
        status.status.error_message = state.error_message
    return response


class Api:
    """Every RPC of both services, registered with trainserve.protos' generated servicer functions; a ServingError
    ends the call with its status and message."""

    def __init__(self, servables: Servables, executor: futures.Executor):
        self.servables, self.executor = servables, executor

    async def Predict(self, request, context):
        name, version, label = parse_model_spec(request.model_spec)
        sampled = self.servables.sample(name, origin_of(context.invocation_metadata()))
        try:
            version, signature, outputs = await self.servables.predict_async(
                name,
                version,
                label,
                request.model_spec.signature_name,
                decode_inputs(request),
                request.output_filter,
                self.executor,
            )
        except ServingError as exc:
            await context.abort(exc.code, str(exc))
        response = predict_response(name, version, signature, outputs)
        if sampled is not None:
            wire = functools.partial(serialized, request, response)  # serialized on the capture's thread
            Capture.log(sampled, (name, version, signature), wire, metadata_value(context, REQUEST_ID_HEADER))
        return response

    async def GetModelMetadata(self, request, context):
        name, version, label = parse_model_spec(request.model_spec)
        try:
            check_metadata_fields(request.metadata_field)
            version, signature_map = self.servables.metadata(name, version, label)
        except ServingError as exc:
            await context.abort(exc.code, str(exc))
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        fill_model_spec(response.model_spec, name, version)
        response.metadata["signature_def"].Pack(signature_map)
        return response

    async def GetModelStatus(self, request, context):
        try:
            return status_response(self.servables.status(*parse_model_spec(request.model_spec)))
        except ServingError as exc:
            await context.abort(exc.code, str(exc))

    async def Classify(self, request, context):
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "serve-local implements Predict and GetModelMetadata only; use tensorflow_model_server for "
            "Classify, Regress and MultiInference",
        )

    Regress = MultiInference = Classify

    async def HandleReloadConfigRequest(self, request, context):
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "serve-local reloads by polling its config file")


class GrpcServer:
    """A grpc.aio server on its own event loop thread, driven from synchronous code (server.py, tests): both
    services (and grpc.health.v1 when `health`) on 0.0.0.0:`port` (0: any free port, see .port), started.

    `run_threads` threads run the requests that do not join a batch (every request when batching is
    off), so that a model call never blocks the loop.
    """

    def __init__(
        self,
        servables: Servables,
        port: int,
        run_threads: int,
        health: bool = False,
        credentials: grpc.ServerCredentials | None = None,  # TLS (--ssl_config_file); None: plaintext
    ):
        self.servables = servables
        self.executor = futures.ThreadPoolExecutor(max_workers=run_threads, thread_name_prefix="predict")
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="grpc-aio", daemon=True)
        self._thread.start()
        try:
            self.port = self._call(self._start(port, health, credentials))
        except BaseException:
            self._close_loop()
            raise

    def _call(self, coroutine, timeout: float | None = 30):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    async def _start(self, port: int, health: bool, credentials: grpc.ServerCredentials | None) -> int:
        self.server = grpc.aio.server(
            options=[("grpc.max_receive_message_length", MAX_MESSAGE), ("grpc.max_send_message_length", MAX_MESSAGE)],
        )
        api = Api(self.servables, self.executor)
        add_PredictionServiceServicer_to_server(api, self.server)
        add_ModelServiceServicer_to_server(api, self.server)
        if health:
            self.server.add_generic_rpc_handlers((health_handler(self.servables),))
        address = f"0.0.0.0:{port}"
        bound = (
            self.server.add_secure_port(address, credentials) if credentials else self.server.add_insecure_port(address)
        )
        if bound == 0:
            raise TrainserveError(f"--port {port} could not be bound: expected a free port")
        await self.server.start()
        return bound

    def stop(self, grace: float | None) -> futures.Future:
        """Stop accepting now; calls in flight get `grace` seconds. The future is done when all ended."""
        return asyncio.run_coroutine_threadsafe(self.server.stop(grace), self.loop)

    def close(self) -> None:
        """After stop(): end the loop's thread and the run threads."""
        self._close_loop()
        self.executor.shutdown(wait=True)

    def _close_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()
