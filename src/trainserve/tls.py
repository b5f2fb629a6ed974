"""The clients' TLS towards a server: the four `--tls-*` flags, declared once for every client (eval, load, the
rollout steps), and the channel credentials they make. trainserve.client builds its channels from them;
serve-local's side is serving/tls.py.

TLS is on when any file is given: a CA alone is server-only TLS (verifying the server with that CA), a
certificate and key add mutual TLS; without a CA the system's roots verify the server. Python's ssl module
checks the files before the first call (no crypto package: the core install is the eval client), so a
malformed PEM or a key that is not the certificate's fails at start with the flag's name, not at the first
handshake. gRPC is imported only to build the credentials, so that a config declaring these flags (and so
`--help`) stays free of it.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from trainserve.errors import TrainserveError
from trainserve.options import option

TARGET_NAME_OVERRIDE = "grpc.ssl_target_name_override"


@dataclass(frozen=True)
class ClientTls:
    """What a client was given; a config's field `tls: ClientTls` makes the flags `--tls-ca`, `--tls-cert`,
    `--tls-key`, `--tls-server-name` and the variables TRAINSERVE_TLS_CA, ... (trainserve.options)."""

    ca: Path | None = option(
        None, "PEM root certificate(s) that verify a TLS server (default: plaintext gRPC)", metavar="FILE"
    )
    cert: Path | None = option(
        None, "PEM client certificate, for a server that verifies clients (with --tls-key)", metavar="FILE"
    )
    key: Path | None = option(None, "PEM private key of --tls-cert, unencrypted", metavar="FILE")
    server_name: str | None = option(
        None,
        "the name the server's certificate carries, when --server reaches it by another (an address)",
        metavar="NAME",
    )

    @property
    def enabled(self) -> bool:
        return any((self.ca, self.cert, self.key))

    def check(self) -> None:
        """The flags' combinations, judged before any file is read or any request sent."""
        if bool(self.cert) != bool(self.key):
            given, missing = ("--tls-cert", "--tls-key") if self.cert else ("--tls-key", "--tls-cert")
            raise TrainserveError(f"{given} without {missing}: expected both (mutual TLS) or neither")
        if self.server_name and not self.enabled:
            raise TrainserveError("--tls-server-name needs TLS: expected --tls-ca (and --tls-cert/--tls-key) too")

    def credentials(self):
        """grpc.ChannelCredentials from the PEM files, each checked: readable, PEM, and the key the certificate's."""
        import grpc

        self.check()
        root = _read_pem(self.ca, "--tls-ca") if self.ca else None
        if root is not None:
            _check_certificates(root, self.ca, "--tls-ca")
        chain = private_key = None
        if self.cert and self.key:
            chain, private_key = _read_pem(self.cert, "--tls-cert"), _read_pem(self.key, "--tls-key")
            _check_certificates(chain, self.cert, "--tls-cert")
            _check_pair(self.cert, self.key)
        return grpc.ssl_channel_credentials(root, private_key, chain)

    def channel_options(self) -> list[tuple[str, str]]:
        """The name the server's certificate must carry, when it is not the host in the target."""
        self.check()
        return [(TARGET_NAME_OVERRIDE, self.server_name)] if self.server_name else []


def server_credentials(cert: Path, key: Path, client_ca: Path | None, flags: str):
    """grpc.ServerCredentials for a server's own port (`flags`-cert, -key, -client-ca name the files in errors),
    each file checked as a client's are; with `client_ca`, clients must present a certificate it signed."""
    import grpc

    chain, private_key = _read_pem(cert, f"{flags}-cert"), _read_pem(key, f"{flags}-key")
    _check_certificates(chain, cert, f"{flags}-cert")
    _check_pair(cert, key, flags)
    roots = _read_pem(client_ca, f"{flags}-client-ca") if client_ca else None
    if roots is not None:
        _check_certificates(roots, client_ca, f"{flags}-client-ca")
    return grpc.ssl_server_credentials(
        [(private_key, chain)], root_certificates=roots, require_client_auth=roots is not None
    )


def _read_pem(path: Path, flag: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TrainserveError(f"{flag} {path} cannot be read ({exc.strerror}): expected a PEM file") from None
    if b"-----BEGIN" not in data:
        raise TrainserveError(f"{flag} {path} holds no PEM block: expected -----BEGIN ...----- (PEM, not DER)")
    return data


def _check_certificates(pem: bytes, path: Path, flag: str) -> None:
    try:
        ssl.create_default_context(cadata=pem.decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError, ValueError) as exc:
        raise TrainserveError(
            f"{flag} {path} is not a valid PEM certificate ({_reason(exc)}): expected -----BEGIN CERTIFICATE-----"
        ) from None


class _EncryptedKey(Exception):
    pass


def _no_passphrase() -> bytes:
    raise _EncryptedKey  # gRPC takes no passphrase; without this callback OpenSSL would prompt on the terminal


def _check_pair(cert: Path, key: Path, flags: str = "--tls") -> None:
    """The key parses and is the certificate's own (OpenSSL's check, through Python's ssl)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_cert_chain(cert, key, password=_no_passphrase)
    except _EncryptedKey:
        raise TrainserveError(f"{flags}-key {key} is encrypted: expected an unencrypted PEM private key") from None
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise TrainserveError(
                f"{flags}-key {key} is not the key of {flags}-cert {cert}: expected its own key"
            ) from None
        raise TrainserveError(
            f"{flags}-key {key} is not a valid PEM private key ({_reason(exc)}): expected -----BEGIN PRIVATE KEY-----"
        ) from None


def _reason(exc: BaseException) -> str:
    return getattr(exc, "reason", None) or str(exc).splitlines()[0] or type(exc).__name__
