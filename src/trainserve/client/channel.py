"""How a client reaches a server: the gRPC channel, plaintext or TLS, built in one place.

Every client (eval, load, rollout, the benchmarks) gets its channel from `open_channel`, so a new way to reach
a server is added here once; what TLS takes (`--tls-*`) is trainserve/tls.py.
"""

from __future__ import annotations

import collections

import grpc

from trainserve.tls import ClientTls
from trainserve.traffic.origin import origin_metadata

MAX_MESSAGE_BYTES = 2**31 - 1  # INT32_MAX: the largest message gRPC and TF Serving (model_servers/server.cc) accept


def open_channel(server: str, tls: ClientTls | None = None, max_message_bytes: int = MAX_MESSAGE_BYTES) -> grpc.Channel:
    """A channel to `server` (HOST:PORT) that sends and receives messages up to `max_message_bytes`; over TLS when
    `tls` names a file. A bad certificate file or flag is a one-line error here, before any request."""
    options = [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]
    if tls is None:
        return grpc.insecure_channel(server, options=options)
    options += tls.channel_options()
    if not tls.enabled:
        return grpc.insecure_channel(server, options=options)
    return grpc.secure_channel(server, tls.credentials(), options=options)


class _CallDetails(
    collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready")),
    grpc.ClientCallDetails,
):
    """A call's details with the metadata changed (grpc.ClientCallDetails has no constructor of its own)."""


class _OriginHeader(grpc.UnaryUnaryClientInterceptor):
    """Adds `x-trainserve-origin` to every call, so that a capturing server leaves it out of its capture."""

    def __init__(self, origin: str):
        self.header = origin_metadata(origin)

    def intercept_unary_unary(self, continuation, details, request):
        metadata = (*(details.metadata or ()), *self.header)
        changed = _CallDetails(details.method, details.timeout, metadata, details.credentials, details.wait_for_ready)
        return continuation(changed, request)


def with_origin(channel: grpc.Channel, origin: str | None) -> grpc.Channel:
    """`channel` whose calls say they come from trainserve's `origin` (replay, eval, load); as is for None."""
    return channel if origin is None else grpc.intercept_channel(channel, _OriginHeader(origin))
