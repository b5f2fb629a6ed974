"""`--ssl_config_file`: TF Serving's `SSLConfig` (tensorflow_serving/config/ssl_config.proto) as gRPC server
credentials, checked before any port opens.

The file is a text proto whose fields hold PEM *contents*, not paths: `server_key`, `server_cert`, `custom_ca`
and `client_verify`. As in model_servers/server.cc (BuildServerCredentialsFromSSLConfigFile), `client_verify`
requires every client to present a certificate that `custom_ca` verifies, and it covers the gRPC port only.
Where tensorflow_model_server would start with a bad file and let every handshake fail (a key that is not the
certificate's, an expired certificate, `client_verify` with no CA to verify against), serve-local stops at
start with one line naming the field.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

import grpc

from trainserve.errors import TrainserveError, first_line
from trainserve.model_server_config import parse_text_proto
from trainserve.protos import ssl_config_pb2


@dataclass(frozen=True)
class ServerTls:
    """A checked SSLConfig: what grpc.ssl_server_credentials takes, and when the certificate expires."""

    key: bytes
    cert_chain: bytes
    client_ca: bytes | None  # set only with client_verify, as server.cc sets pem_root_certs
    client_verify: bool
    expires: datetime.datetime

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.key, self.cert_chain)], root_certificates=self.client_ca, require_client_auth=self.client_verify
        )


def load_ssl_config(path: Path) -> ServerTls:
    """Parse and check `--ssl_config_file`; every failure is one line naming the file and the field."""
    config = parse_text_proto(path, ssl_config_pb2.SSLConfig(), "ssl config file")
    where = f"ssl config file {path}"
    certs = _certificates(config.server_cert, f"{where}: server_cert")
    key = _private_key(config.server_key, f"{where}: server_key")
    if key.public_key() != certs[0].public_key():
        raise TrainserveError(f"{where}: server_key is not the key of server_cert: expected the certificate's own key")
    expires = _check_validity(certs[0], f"{where}: server_cert")
    if config.client_verify and not config.custom_ca.strip():
        raise TrainserveError(
            f"{where}: client_verify is true but custom_ca is empty: expected the PEM of the CA that signs client "
            "certificates"
        )
    client_ca = None
    if config.client_verify:
        _certificates(config.custom_ca, f"{where}: custom_ca")
        client_ca = config.custom_ca.encode()
    return ServerTls(config.server_key.encode(), config.server_cert.encode(), client_ca, config.client_verify, expires)


def _pem_text(text: str, what: str, kind: str) -> bytes:
    if not text.strip():
        raise TrainserveError(f"{what} is empty: expected the PEM contents of a {kind}")
    if "-----BEGIN" not in text:
        raise TrainserveError(
            f"{what} holds no PEM block ({text.strip()[:40]!r}): expected the {kind}'s PEM contents, not a path"
        )
    return text.encode()


def _certificates(text: str, what: str) -> list:
    """The PEM certificates in `text`, leaf first; a block that does not parse is named."""
    from cryptography import x509

    data = _pem_text(text, what, "certificate")
    try:
        return x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise TrainserveError(
            f"{what} is not a valid PEM certificate ({first_line(exc)}): expected -----BEGIN CERTIFICATE-----"
        ) from None


def _private_key(text: str, what: str):
    from cryptography.hazmat.primitives import serialization

    data = _pem_text(text, what, "private key")
    try:
        return serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise TrainserveError(f"{what} is encrypted: expected an unencrypted PEM private key") from None
    except ValueError as exc:
        raise TrainserveError(
            f"{what} is not a valid PEM private key ({first_line(exc)}): expected -----BEGIN PRIVATE KEY-----"
        ) from None


def _check_validity(cert, what: str) -> datetime.datetime:
    """Every client refuses an expired (or not yet valid) server certificate, so serving with one is not serving."""
    now = datetime.datetime.now(datetime.UTC)
    if cert.not_valid_after_utc < now:
        raise TrainserveError(
            f"{what} expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC: expected a current certificate"
        )
    if cert.not_valid_before_utc > now:
        raise TrainserveError(
            f"{what} is not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC: expected a current certificate"
        )
    return cert.not_valid_after_utc
