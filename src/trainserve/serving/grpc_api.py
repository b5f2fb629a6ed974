"""TF Serving's gRPC API: PredictionService (Predict, GetModelMetadata) and ModelService
(GetModelStatus), with the request and response messages of the tensorflow-serving-api wheel.

Classify, Regress, MultiInference and HandleReloadConfigRequest answer UNIMPLEMENTED with a message
that says what to use instead.
"""

from __future__ import annotations

from concurrent import futures

import grpc
from google.protobuf import wrappers_pb2
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from trainserve.errors import TrainserveError
from trainserve.serving.health import health_handler
from trainserve.serving.servables import Servables, ServingError
from trainserve.tensors import from_tensor_proto, to_tensor_proto

MAX_MESSAGE = 2**31 - 1  # TF Serving's gRPC message limit, both ways (INT32_MAX, model_servers/server.cc)
ERROR_CODE_UNKNOWN = 2  # tensorflow.error.Code UNKNOWN: what a failed load reports in its status


def parse_model_spec(model_spec) -> tuple[str, int | None, str | None]:
    """(name, version, label); a set version is taken as asked, even 0 (ServerCore::ServableRequestFromModelSpec)."""
    choice = model_spec.WhichOneof("version_choice")
    version = model_spec.version.value if choice == "version" else None
    label = model_spec.version_label if choice == "version_label" else None
    return model_spec.name, version, label


def abort(context, exc: ServingError):
    """End the RPC with the error's status; context.abort raises, so nothing after a call runs."""
    context.abort(exc.code, str(exc))


class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, servables: Servables):
        self.servables = servables

    def Predict(self, request, context):
        name, version, label = parse_model_spec(request.model_spec)
        try:
            inputs = {k: from_tensor_proto(v) for k, v in request.inputs.items()}
            version, signature, outputs = self.servables.predict(
                name, version, label, request.model_spec.signature_name, inputs, request.output_filter
            )
        except TrainserveError as exc:  # an input tensor that cannot be decoded
            abort(context, ServingError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)))
        except ServingError as exc:
            abort(context, exc)
        response = predict_pb2.PredictResponse(
            model_spec=model_pb2.ModelSpec(
                name=name, version=wrappers_pb2.Int64Value(value=version), signature_name=signature
            )
        )
        for key, value in outputs.items():
            # *_val fields, not tensor_content: what TF Serving sends by default (tensorflow/serving#1276).
            to_tensor_proto(value, as_values=True, into=response.outputs[key])
        return response

    def GetModelMetadata(self, request, context):
        name, version, label = parse_model_spec(request.model_spec)
        unsupported = [f for f in request.metadata_field if f != "signature_def"]
        if unsupported or not request.metadata_field:
            abort(
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
            abort(context, exc)
        response = get_model_metadata_pb2.GetModelMetadataResponse(
            model_spec=model_pb2.ModelSpec(name=name, version=wrappers_pb2.Int64Value(value=version))
        )
        response.metadata["signature_def"].Pack(signature_map)
        return response

    def _unimplemented(self, request, context):
        abort(
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
            states = self.servables.status(*parse_model_spec(request.model_spec))
        except ServingError as exc:
            abort(context, exc)
        response = get_model_status_pb2.GetModelStatusResponse()
        for state in states:
            status = response.model_version_status.add(version=state.version, state=state.state)
            status.status.error_code = 0 if state.error_code == "OK" else ERROR_CODE_UNKNOWN
            status.status.error_message = state.error_message
        return response

    def HandleReloadConfigRequest(self, request, context):
        abort(context, ServingError(grpc.StatusCode.UNIMPLEMENTED, "serve-local reloads by polling its config file"))


def start_grpc_server(servables: Servables, port: int, max_workers: int, health: bool = False) -> grpc.Server:
    """Both services (and grpc.health.v1 when `health`) on 0.0.0.0:`port`, started."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers),
        options=[("grpc.max_receive_message_length", MAX_MESSAGE), ("grpc.max_send_message_length", MAX_MESSAGE)],
    )
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(PredictionService(servables), server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelService(servables), server)
    if health:
        server.add_generic_rpc_handlers((health_handler(servables),))
    if server.add_insecure_port(f"0.0.0.0:{port}") == 0:
        raise TrainserveError(f"--port {port} could not be bound: expected a free port")
    server.start()
    return server
