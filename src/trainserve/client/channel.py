"""How a client reaches a server: the gRPC channel, plaintext or TLS, built in one place.

Every client (eval, load, rollout, the benchmarks) gets its channel from `open_channel`, so a new way to reach
a server (a client certificate, a server name to verify) is added here once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

from trainserve.errors import TrainserveError

MAX_MESSAGE_BYTES = 2**31 - 1  # INT32_MAX: the largest message gRPC and TF Serving (model_servers/server.cc) accept


@dataclass(frozen=True)
class Tls:
    """TLS towards the server; each field is the flag of the same name (`--tls-ca`)."""

    ca: Path | None = None  # PEM root certificate(s) that verify the server (None: the system's roots)

    @classmethod
    def from_flags(cls, ca: Path | None = None) -> Tls | None:
        """TLS as the flags ask for it; None (plaintext) when no TLS flag is given."""
        return None if ca is None else cls(ca)

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=_read_pem(self.ca, "--tls-ca"))


def open_channel(server: str, max_message_bytes: int = MAX_MESSAGE_BYTES, tls: Tls | None = None) -> grpc.Channel:
    """A channel to `server` (HOST:PORT) that sends and receives messages up to `max_message_bytes`; over TLS when
    `tls` is given. An unreadable certificate file is a one-line error here, before any request."""
    options = [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]
    if tls is None:
        return grpc.insecure_channel(server, options=options)
    return grpc.secure_channel(server, tls.credentials(), options=options)


def _read_pem(path: Path | None, flag: str) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise TrainserveError(f"{flag} {path} cannot be read ({exc.strerror}): expected a PEM file") from None
