"""The gRPC side of `trainserve capture`: TF Serving's PredictionService and ModelService (and grpc.health.v1's
Check) forwarded as bytes on grpc.aio, nothing decoded or re-encoded on the way. The client's deadline travels
as the upstream call's timeout, its metadata with it; TF Serving's status code, details and trailing metadata come
back as they were. A sampled Predict is handed to the capture after its answer is on its way."""

from __future__ import annotations

import asyncio

import grpc

from trainserve.capture.sampling import ProxyCapture

FORWARDED = ("/tensorflow.serving.PredictionService/", "/tensorflow.serving.ModelService/", "/grpc.health.v1.Health/")
STREAMING = ("/grpc.health.v1.Health/Watch",)  # forwarded methods are unary; this one streams
PREDICT = "/tensorflow.serving.PredictionService/Predict"
MAX_MESSAGE = 2**31 - 1  # as TF Serving's own limit (INT32_MAX)
MESSAGE_OPTIONS = [("grpc.max_send_message_length", MAX_MESSAGE), ("grpc.max_receive_message_length", MAX_MESSAGE)]
# Metadata gRPC itself sets on each hop: not the client's to forward.
_OWN_KEYS = frozenset({"user-agent", "content-type", "te", "grpc-accept-encoding", "grpc-timeout", "grpc-encoding"})


def forwarded_metadata(metadata) -> tuple:
    return tuple((k, v) for k, v in metadata or () if not k.startswith(":") and k not in _OWN_KEYS)


class Forwarder(grpc.GenericRpcHandler):
    """Every forwarded method, as a raw-bytes handler over one upstream channel."""

    def __init__(self, channel: grpc.aio.Channel, capture: ProxyCapture | None):
        self.channel, self.capture = channel, capture
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}

    def service(self, handler_call_details):
        method = handler_call_details.method
        handler = self._handlers.get(method)
        if handler is None and method.startswith(FORWARDED) and method not in STREAMING:
            handler = self._handlers[method] = grpc.unary_unary_rpc_method_handler(self._forwarding(method))
        return handler  # None: UNIMPLEMENTED, as TF Serving answers a method it lacks

    def _forwarding(self, method: str):
        upstream = self.channel.unary_unary(method)  # no serializers: bytes in, bytes out
        capture = self.capture if method == PREDICT else None

        async def forward(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            sampled = capture is not None and capture.sample()
            metadata = forwarded_metadata(context.invocation_metadata())
            call = upstream(request, timeout=context.time_remaining(), metadata=metadata)
            try:
                response = await call
            except grpc.aio.AioRpcError as err:
                await context.abort(err.code(), err.details() or "", err.trailing_metadata() or ())
            except asyncio.CancelledError:  # the client left: so does the upstream call
                call.cancel()
                raise
            trailing = await call.trailing_metadata()
            if trailing:
                context.set_trailing_metadata(tuple(trailing))
            if sampled:
                capture.log(request, response, metadata)
            return response

        return forward


async def start_grpc_proxy(
    port: int,
    channel: grpc.aio.Channel,
    capture: ProxyCapture | None,
    credentials: grpc.ServerCredentials | None,
) -> tuple[grpc.aio.Server, int]:
    """The proxy's gRPC server on 0.0.0.0:`port`, started; returns it and the bound port."""
    server = grpc.aio.server(options=MESSAGE_OPTIONS)
    server.add_generic_rpc_handlers((Forwarder(channel, capture),))
    address = f"0.0.0.0:{port}"
    bound = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"port {port} could not be bound")
    await server.start()
    return server, bound


def upstream_channel(target: str, tls) -> grpc.aio.Channel:
    """The aio channel to TF Serving, plaintext or TLS (`--tls-*`, checked as every client checks them)."""
    options = MESSAGE_OPTIONS + tls.channel_options()
    if not tls.enabled:
        return grpc.aio.insecure_channel(target, options=options)
    return grpc.aio.secure_channel(target, tls.credentials(), options=options)
