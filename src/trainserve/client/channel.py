"""How a client reaches a server: the gRPC channel, plaintext or TLS, built in one place.

Every client (eval, load, rollout, the benchmarks) gets its channel from `open_channel`, so a new way to reach
a server is added here once; what TLS takes (`--tls-*`) is trainserve/tls.py.
"""

from __future__ import annotations

import grpc

from trainserve.tls import ClientTls

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
