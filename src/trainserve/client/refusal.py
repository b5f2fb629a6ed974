"""One line saying why a server refused this client's connection over TLS, or for the lack of it.

From the client's side every refusal is UNAVAILABLE ("failed to connect to all addresses"); what tells them
apart is in the error's text, or nowhere: a server that refuses the client's certificate (missing, expired,
signed by a CA it does not trust) or a plaintext client just closes the socket ("Socket closed"), so
`describe_refusal` reads what this client sent, its certificate's dates, and asks the server for a TLS
handshake when a plaintext call was refused.
"""

from __future__ import annotations

import datetime
import re
import socket
import ssl
from pathlib import Path

import grpc

from trainserve.tls import ClientTls

PEM_CERTIFICATE = re.compile(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.DOTALL)
CLOSED = ("Socket closed", "Connection reset", "End of TCP stream", "connection closed")
PROBE_SECONDS = 5


def describe_refusal(error: grpc.RpcError, target: str, tls: ClientTls | None) -> str | None:
    """One line saying why `target` refused this client's connection over TLS (or for the lack of it), or
    None when the error is no TLS refusal (the caller reports it as before: a closed port, a model error)."""
    if not hasattr(error, "code") or error.code() != grpc.StatusCode.UNAVAILABLE:
        return None
    text = f"{error.details()} {error.debug_error_string() if hasattr(error, 'debug_error_string') else ''}"
    tls = tls or ClientTls()
    if tls.enabled:
        return _handshake_failure(text, target, tls) or _certificate_refused(text, target, tls)
    if any(mark in text for mark in CLOSED) and _speaks_tls(target):
        return (
            f"{target} requires TLS and this client spoke plaintext: pass --tls-ca (and --tls-cert/--tls-key "
            "if the server verifies clients)"
        )
    return None


def _handshake_failure(text: str, target: str, tls: ClientTls) -> str | None:
    """Failures the client's own handshake reports: plaintext server, server certificate not trusted."""
    if "WRONG_VERSION_NUMBER" in text:
        return f"{target} speaks plaintext gRPC, not TLS: drop --tls-ca/--tls-cert/--tls-key for this server"
    if "certificate has expired" in text:
        return f"{target}'s certificate has expired: the server needs a renewed certificate (and a restart)"
    if "Hostname Verification" in text or "No match found for server name" in text:
        name = tls.server_name or _host(target) or target
        return (
            f"{target}'s certificate does not name {name!r}: reach it by a name in its certificate, or set "
            "--tls-server-name to one"
        )
    if "CERTIFICATE_VERIFY_FAILED" in text:
        reason = text.split("CERTIFICATE_VERIFY_FAILED:", 1)[1].split(":", 1)[0].strip()
        trust = f"--tls-ca {tls.ca}" if tls.ca else "the system's CAs (no --tls-ca)"
        return f"{target}'s certificate is not trusted by {trust} ({reason}): expected the CA that signed it"
    return None


def _certificate_refused(text: str, target: str, tls: ClientTls) -> str | None:
    """The handshake went through, then the server closed the socket: it refused what we presented."""
    if not any(mark in text for mark in CLOSED):
        return None
    if not tls.cert:
        return (
            f"{target} closed the connection after the TLS handshake: it requires a client certificate "
            "(client_verify): pass --tls-cert and --tls-key"
        )
    expired = not_after(tls.cert)
    if expired is not None and expired < datetime.datetime.now(datetime.UTC):
        return f"{target} refused the client certificate: --tls-cert {tls.cert} expired on {expired:%Y-%m-%d %H:%M} UTC"
    return (
        f"{target} refused the client certificate --tls-cert {tls.cert}: expected one signed by a CA the server "
        "trusts (its custom_ca)"
    )


def _host(target: str) -> str | None:
    address = re.sub(r"^(dns:(//[^/]*/)?|ipv4:|ipv6:)", "", target)
    host, _, port = address.rpartition(":")
    return host.strip("[]") if host and port.isdigit() else None


def _speaks_tls(target: str) -> bool:
    """Whether `target` answers a TLS handshake (verifying nothing: only whether the server speaks TLS)."""
    host = _host(target)
    if host is None:
        return False
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    port = int(target.rpartition(":")[2])
    try:
        with socket.create_connection((host, port), timeout=PROBE_SECONDS) as raw, context.wrap_socket(raw):
            return True
    except ssl.SSLError as exc:
        return "ALERT" in (exc.reason or "")  # a TLS server that refused us in the handshake still speaks TLS
    except OSError:
        return False


def not_after(cert: Path) -> datetime.datetime | None:
    """The first certificate's notAfter (None: unreadable), read from its DER. Python's ssl decodes only a
    peer's certificate (and, loaded as a CA, no leaf: SSLContext.get_ca_certs skips it), and the client
    installs no crypto package, so the few fields before the validity are walked here."""
    try:
        block = PEM_CERTIFICATE.search(Path(cert).read_text())
        der = ssl.PEM_cert_to_DER_cert(block.group(0)) if block else b""
        _, start, end = _tlv(der, 0)  # Certificate
        _, start, end = _tlv(der, start)  # TBSCertificate
        fields = _children(der, start, end)
        if fields[0][0] == 0xA0:  # [0] version, present in v3 certificates
            fields = fields[1:]
        validity = fields[3]  # serialNumber, signature, issuer, validity
        tag, start, end = _children(der, validity[1], validity[2])[1]  # notBefore, notAfter
        text = der[start:end].decode("ascii")
        layout = "%y%m%d%H%M%SZ" if tag == 0x17 else "%Y%m%d%H%M%SZ"  # UTCTime until 2049, GeneralizedTime after
        return datetime.datetime.strptime(text, layout).replace(tzinfo=datetime.UTC)
    except (OSError, ValueError, IndexError):
        return None


def _tlv(der: bytes, at: int) -> tuple[int, int, int]:
    """(tag, value start, value end) of the DER element at `at`."""
    tag, length = der[at], der[at + 1]
    at += 2
    if length & 0x80:
        size = length & 0x7F
        length = int.from_bytes(der[at : at + size], "big")
        at += size
    return tag, at, at + length


def _children(der: bytes, start: int, end: int) -> list[tuple[int, int, int]]:
    children = []
    while start < end:
        children.append(_tlv(der, start))
        start = children[-1][2]
    return children
