"""Development certificates for serving over TLS (`make certs`): a CA, a server and a client certificate.

FOR DEVELOPMENT AND TESTS ONLY: the CA's key sits beside its certificate and the other keys are readable by
every user of this machine (the containers' uid, 10001, must read them through a bind mount). Real
deployments take certificates from their own CA or cert-manager (k8s/components/tls-cert-manager).

    python scripts/certs.py DIR [--days N]

DIR/ca.crt, ca.key   the development CA (signs both certificates below; trusted by both sides)
DIR/server/          tls.crt, tls.key, ca.crt: SANs localhost, 127.0.0.1 and serve-cpu (the compose service)
DIR/client/          tls.crt, tls.key, ca.crt: a client certificate for mutual TLS (eval, rollout)
The file names are a Kubernetes Secret's of type kubernetes.io/tls (plus ca.crt), as serve-cpu mounts them.

Needs only `cryptography` (trainserve's `serve` extra); tests import the functions to make certificates.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SERVER_NAMES = ("localhost", "127.0.0.1", "serve-cpu")
CLIENT_NAME = "trainserve-client"
DAY = datetime.timedelta(days=1)


def new_key() -> ec.EllipticCurvePrivateKey:
    """P-256: what gRPC's TLS (BoringSSL) accepts everywhere, and fast to make in tests."""
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _window(days: float, start: datetime.datetime | None) -> tuple[datetime.datetime, datetime.datetime]:
    start = start or datetime.datetime.now(datetime.UTC) - DAY  # a skewed clock still sees it valid
    return start, start + DAY + days * DAY


def make_ca(common_name: str = "trainserve development CA", days: float = 365, start=None):
    """(certificate, key) of a self-signed CA."""
    key = new_key()
    not_before, not_after = _window(days, start)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(*[False] * 5, True, True, False, False), critical=True)  # cert + CRL sign
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    return builder.sign(key, hashes.SHA256()), key


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def issue(ca, common_name: str, names=(), client: bool = False, days: float = 365, start=None):
    """(certificate, key) signed by `ca` = (certificate, key): a server certificate for `names`, or a client's."""
    ca_cert, ca_key = ca
    key = new_key()
    not_before, not_after = _window(days, start)
    usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName([_san(n) for n in names]), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def cert_pem(cert) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def key_pem(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )  # fmt: skip


def write_pair(directory: Path, pair, ca_cert) -> Path:
    """tls.crt, tls.key and ca.crt in `directory`: a kubernetes.io/tls Secret's keys."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = pair
    (directory / "tls.crt").write_bytes(cert_pem(cert))
    (directory / "tls.key").write_bytes(key_pem(key))
    (directory / "tls.key").chmod(0o644)  # development: the containers' uid reads it through a bind mount
    (directory / "ca.crt").write_bytes(cert_pem(ca_cert))
    return directory


def write_development_set(out: Path, days: float = 365) -> None:
    """The CA, server and client sets under `out` (see the module docstring)."""
    out.mkdir(parents=True, exist_ok=True)
    ca = make_ca(days=days)
    (out / "ca.crt").write_bytes(cert_pem(ca[0]))
    (out / "ca.key").write_bytes(key_pem(ca[1]))
    (out / "ca.key").chmod(0o600)
    write_pair(out / "server", issue(ca, "serve-cpu", SERVER_NAMES, days=days), ca[0])
    write_pair(out / "client", issue(ca, CLIENT_NAME, client=True, days=days), ca[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Development CA, server and client certificates (NOT for production)")
    parser.add_argument("out", type=Path, help="directory to write (must not hold a ca.crt yet)")
    parser.add_argument("--days", type=float, default=365, help="validity of every certificate")
    args = parser.parse_args(argv)
    if (args.out / "ca.crt").exists():
        print(f"certs: {args.out}/ca.crt exists: remove {args.out} to make new certificates", file=sys.stderr)
        return 1
    write_development_set(args.out, args.days)
    print(
        f"certs: wrote a DEVELOPMENT CA, server certificate ({', '.join(SERVER_NAMES)}) and client certificate "
        f"to {args.out}/ (keys readable by any local user: for development and tests only)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
