"""`--enable_grpc_healthcheck_service`: the standard gRPC health service (grpc.health.v1.Health, from
grpc/src/proto/grpc/health/v1/health.proto) on the gRPC port, so Kubernetes `grpc:` probes and
grpc_health_probe work.

Unlike TF Serving's, which answers SERVING as soon as the port is up, ours looks at the models: the
server ("" or a service name of ours) is SERVING only while every configured model has a version
AVAILABLE, and a model's name as the service asks about that model alone. A config reload that adds a
model with nothing published yet, or a version directory removed, turns it NOT_SERVING; so does the
drain at shutdown.

No grpcio-health-checking: its servicer keeps statuses that someone must push on every change, while
ours is computed on each call from the version states. Its two messages are built here as descriptors,
in a pool of their own so they never clash with the wheel's.
"""

from __future__ import annotations

import asyncio

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf import message_factory as _factory

from trainserve.serving.servables import Servables

SERVICE = "grpc.health.v1.Health"
UNKNOWN, SERVING, NOT_SERVING, SERVICE_UNKNOWN = 0, 1, 2, 3  # HealthCheckResponse.ServingStatus
OUR_SERVICES = ("", "tensorflow.serving.PredictionService", "tensorflow.serving.ModelService")
WATCH_POLL_SECONDS = 0.5


def _messages():
    f = descriptor_pb2.FieldDescriptorProto
    schema = descriptor_pb2.FileDescriptorProto(name="grpc/health/v1/health.proto", package="grpc.health.v1")
    request = schema.message_type.add(name="HealthCheckRequest")
    request.field.add(name="service", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    response = schema.message_type.add(name="HealthCheckResponse")
    status = response.enum_type.add(name="ServingStatus")
    for name, number in (("UNKNOWN", 0), ("SERVING", 1), ("NOT_SERVING", 2), ("SERVICE_UNKNOWN", 3)):
        status.value.add(name=name, number=number)
    response.field.add(
        name="status",
        number=1,
        type=f.TYPE_ENUM,
        label=f.LABEL_OPTIONAL,
        type_name=".grpc.health.v1.HealthCheckResponse.ServingStatus",
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(schema)
    get = pool.FindMessageTypeByName
    return (
        _factory.GetMessageClass(get("grpc.health.v1.HealthCheckRequest")),
        _factory.GetMessageClass(get("grpc.health.v1.HealthCheckResponse")),
    )


HealthCheckRequest, HealthCheckResponse = _messages()


def serving_status(servables: Servables, service: str) -> int | None:
    """SERVING/NOT_SERVING for the server or one model; None for a service name we do not know."""
    models = servables.manager.models
    if service in OUR_SERVICES:
        wanted = list(models.values())
    elif service in models:
        wanted = [models[service]]
    else:
        return None
    if servables.stopping.is_set() or not all(m.available() for m in wanted):
        return NOT_SERVING
    return SERVING


class Health:
    """Coroutines for the gRPC event loop (grpc_api.GrpcServer)."""

    def __init__(self, servables: Servables):
        self.servables = servables

    async def Check(self, request, context):
        status = serving_status(self.servables, request.service)
        if status is None:  # the protocol's answer for an unknown service
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return HealthCheckResponse(status=status)

    async def Watch(self, request, context):
        """Send the status now and on every change, until the client leaves (the call is then
        cancelled) or the server drains."""
        last = None
        while True:
            status = serving_status(self.servables, request.service)
            status = SERVICE_UNKNOWN if status is None else status
            if status != last:
                yield HealthCheckResponse(status=status)
                last = status
            if self.servables.stopping.is_set() and last == NOT_SERVING:
                return
            await asyncio.sleep(WATCH_POLL_SECONDS)


def health_handler(servables: Servables) -> grpc.GenericRpcHandler:
    health = Health(servables)
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Check": grpc.unary_unary_rpc_method_handler(
                health.Check,
                request_deserializer=HealthCheckRequest.FromString,
                response_serializer=HealthCheckResponse.SerializeToString,
            ),
            "Watch": grpc.unary_stream_rpc_method_handler(
                health.Watch,
                request_deserializer=HealthCheckRequest.FromString,
                response_serializer=HealthCheckResponse.SerializeToString,
            ),
        },
    )
