"""gRPC over TLS: serve-local's --ssl_config_file (TF Serving's SSLConfig) and the client side (trainserve.tls's
credentials, trainserve.client's channel and refusals),
with certificates made at test time by scripts/certs.py (what `make certs` runs).

A real serve-local answers on real sockets; each refused client (plaintext, no certificate, a CA that does
not trust the server, a certificate the server does not trust, an expired one) gets one line from
`describe_refusal`, and the right client is answered again after every refusal."""

from __future__ import annotations

import datetime
import importlib.util
import socket
import sys
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
from google.protobuf import text_format

from conftest import REPO, assert_one_line_error, free_port, install_version, run_cli
from serving_fixtures import IMAGES, InProcessServer, expected
from trainserve.client import describe_refusal, open_channel
from trainserve.client.refusal import not_after
from trainserve.errors import TrainserveError
from trainserve.protos import predict_pb2, ssl_config_pb2
from trainserve.protos.prediction_service_pb2_grpc import PredictionServiceStub
from trainserve.serving.tls import load_ssl_config
from trainserve.tensors import from_tensor_proto, to_tensor_proto
from trainserve.tls import ClientTls

pytestmark = pytest.mark.unit


def load_certs_script():
    spec = importlib.util.spec_from_file_location("certs", REPO / "scripts" / "certs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["certs"] = module
    spec.loader.exec_module(module)
    return module


certs = load_certs_script()
LONG_AGO = datetime.datetime.now(datetime.UTC) - 30 * certs.DAY
SERVICE = "serve-cpu"  # the only name in the server's certificate: reached at 127.0.0.1, a client names it


@dataclass(frozen=True)
class Pki:
    """PEM files made for this session: `ca` signs the server's and the good client's certificates."""

    root: Path

    def __getattr__(self, name: str) -> Path:  # pki.client_key: root/client.key
        return self.root / ".".join(name.rsplit("_", 1))


def write(root: Path, name: str, data: bytes) -> Path:
    (root / name).write_bytes(data)
    return root / name


@pytest.fixture(scope="session", name="pki")
def make_pki(tmp_path_factory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    ca, other = certs.make_ca(), certs.make_ca("another CA")
    write(root, "ca.crt", certs.cert_pem(ca[0]))
    write(root, "other_ca.crt", certs.cert_pem(other[0]))
    pairs = {
        # Issued for a service name only: reached at 127.0.0.1, a client must name it (--tls-server-name).
        "server": certs.issue(ca, "serving", [SERVICE]),
        "expired_server": certs.issue(ca, "serving", [SERVICE], days=1, start=LONG_AGO),
        "client": certs.issue(ca, "eval", client=True),
        "stranger": certs.issue(other, "eval", client=True),
        "expired_client": certs.issue(ca, "eval", client=True, days=1, start=LONG_AGO),
    }
    for name, (cert, key) in pairs.items():
        write(root, f"{name}.crt", certs.cert_pem(cert))
        write(root, f"{name}.key", certs.key_pem(key))
    return Pki(root)


def ssl_config(path: Path, pki: Pki, client_verify: bool, server: str = "server", **fields) -> Path:
    """An SSLConfig text proto as TF Serving reads it: PEM contents in the fields."""
    config = ssl_config_pb2.SSLConfig(
        server_cert=(pki.root / f"{server}.crt").read_text(),
        server_key=(pki.root / f"{server}.key").read_text(),
        custom_ca=pki.ca_crt.read_text() if client_verify else "",
        client_verify=client_verify,
    )
    for name, value in fields.items():
        setattr(config, name, value)
    path.write_text(text_format.MessageToString(config))
    return path


def mutual(pki: Pki, client: str = "client", ca: str = "ca", server_name: str | None = SERVICE) -> ClientTls:
    return ClientTls(pki.root / f"{ca}.crt", pki.root / f"{client}.crt", pki.root / f"{client}.key", server_name)


def predict(target: str, tls: ClientTls) -> np.ndarray:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "m"
    to_tensor_proto(IMAGES, into=request.inputs["images"])
    with open_channel(target, tls) as channel:
        response = PredictionServiceStub(channel).Predict(request, timeout=30)
    return from_tensor_proto(response.outputs["probabilities"])


def refusal(target: str, tls: ClientTls) -> str:
    with pytest.raises(grpc.RpcError) as err:
        predict(target, tls)
    line = describe_refusal(err.value, target, tls)
    assert line is not None, f"not described: {err.value.details()}"
    assert "\n" not in line
    return line


def start_server(tmp: Path, model: Path, *flags: str) -> InProcessServer:
    install_version(model, tmp / "m", 1)
    server = InProcessServer("--model_name=m", f"--model_base_path={tmp / 'm'}", *flags)
    server.wait_available("m", 1)  # over REST, which stays plaintext as in TF Serving
    return server


@pytest.fixture(scope="module")
def mtls_server(tmp_path_factory, model_versions, pki):
    tmp = tmp_path_factory.mktemp("mtls")
    server = start_server(tmp, model_versions[0], f"--ssl_config_file={ssl_config(tmp / 'ssl.config', pki, True)}")
    yield server
    assert server.stop() == 0


def test_a_client_with_the_right_ca_and_certificate_is_answered(mtls_server, pki, model_versions):
    want = expected(model_versions[0])["probabilities"]
    np.testing.assert_allclose(predict(mtls_server.target, mutual(pki)), want, rtol=1e-5)
    assert "gRPC over TLS (requiring client certificates)" in mtls_server.log()


@pytest.mark.parametrize(
    "client, fragment",
    [
        pytest.param(lambda pki: ClientTls(), "requires TLS and this client spoke plaintext", id="plaintext"),
        pytest.param(
            lambda pki: ClientTls(pki.ca_crt, server_name=SERVICE), "requires a client certificate", id="no-certificate"
        ),
        pytest.param(lambda pki: mutual(pki, ca="other_ca"), "is not trusted by --tls-ca", id="wrong-ca"),
        pytest.param(
            lambda pki: mutual(pki, "stranger"),
            "expected one signed by a CA the server trusts",
            id="certificate-of-another-ca",
        ),
        pytest.param(lambda pki: mutual(pki, "expired_client"), "expired on", id="expired-certificate"),
        pytest.param(lambda pki: mutual(pki, server_name=None), "does not name '127.0.0.1'", id="wrong-name"),
    ],
)
def test_each_refused_client_gets_one_line_and_the_right_one_is_still_answered(mtls_server, pki, client, fragment):
    assert fragment in refusal(mtls_server.target, client(pki))
    assert predict(mtls_server.target, mutual(pki)).shape == (len(IMAGES), 10)


def test_without_client_verify_a_client_without_a_certificate_is_answered(tmp_path, model_versions, pki):
    server = start_server(tmp_path, model_versions[0], f"--ssl_config_file={ssl_config(tmp_path / 's', pki, False)}")
    try:
        assert predict(server.target, ClientTls(pki.ca_crt, server_name=SERVICE)).shape == (len(IMAGES), 10)
        assert predict(server.target, mutual(pki)).shape == (len(IMAGES), 10)  # a certificate is not asked for
        assert "requires TLS" in refusal(server.target, ClientTls())
    finally:
        assert server.stop() == 0


def test_a_tls_client_against_a_plaintext_server_is_told_so(tmp_path, model_versions, pki):
    server = start_server(tmp_path, model_versions[0])
    try:
        assert "speaks plaintext gRPC, not TLS" in refusal(server.target, mutual(pki))
        assert predict(server.target, ClientTls()).shape == (len(IMAGES), 10)
    finally:
        assert server.stop() == 0


def test_an_expired_server_certificate_is_named_by_the_client(pki):
    """serve-local refuses to start with one (below); another server (a TF Serving) may not."""
    server = grpc.server(futures.ThreadPoolExecutor(1))
    key, cert = pki.expired_server_key.read_bytes(), pki.expired_server_crt.read_bytes()
    port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(key, cert)]))
    server.start()
    try:
        assert "certificate has expired" in refusal(f"127.0.0.1:{port}", mutual(pki))
    finally:
        server.stop(None)


def test_a_closed_port_is_no_tls_refusal(pki):
    with pytest.raises(grpc.RpcError) as err:
        predict(f"127.0.0.1:{free_port()}", ClientTls())
    assert describe_refusal(err.value, "127.0.0.1:1", ClientTls()) is None


@pytest.mark.parametrize(
    "start", [LONG_AGO, datetime.datetime(2049, 12, 31, 12, tzinfo=datetime.UTC)], ids=["utc-time", "generalized-time"]
)
def test_a_client_certificates_expiry_is_read_from_its_der_as_cryptography_reads_it(tmp_path, start):
    """The expired-certificate line quotes this date; after 2049 X.509 writes it as GeneralizedTime."""
    cert, _ = certs.issue(certs.make_ca(), "eval", client=True, days=2, start=start)
    assert not_after(write(tmp_path, "c.crt", certs.cert_pem(cert))) == cert.not_valid_after_utc.replace(microsecond=0)
    assert not_after(write(tmp_path, "no.crt", b"not a certificate")) is None


# --- bad inputs at start: serve-local's SSLConfig --------------------------------------------------------------


def mismatched(pki: Pki) -> dict:
    return {"server_key": pki.client_key.read_text()}


@pytest.mark.parametrize(
    "client_verify, fields, fragment",
    [
        (True, lambda pki: mismatched(pki), "server_key is not the key of server_cert"),
        (True, lambda pki: {"custom_ca": ""}, "client_verify is true but custom_ca is empty"),
        (
            False,
            lambda pki: {"server_cert": "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n"},
            "server_cert is not a valid PEM certificate",
        ),
        (False, lambda pki: {"server_cert": "/etc/tls/tls.crt"}, "not a path"),
        (False, lambda pki: {"server_key": ""}, "server_key is empty"),
        (
            True,
            lambda pki: {"custom_ca": "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"},
            "custom_ca is not a valid PEM certificate",
        ),
    ],
    ids=["key-mismatch", "verify-without-ca", "malformed-pem", "path-not-contents", "no-key", "malformed-ca"],
)
def test_a_bad_ssl_config_is_one_line_naming_the_field(tmp_path, pki, client_verify, fields, fragment):
    path = ssl_config(tmp_path / "ssl.config", pki, client_verify, **fields(pki))
    with pytest.raises(TrainserveError, match=fragment) as err:
        load_ssl_config(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_an_expired_server_certificate_or_a_file_that_is_no_ssl_config_stops_the_start(tmp_path, pki):
    with pytest.raises(TrainserveError, match=r"server_cert expired on \d{4}-"):
        load_ssl_config(ssl_config(tmp_path / "expired", pki, False, server="expired_server"))
    (tmp_path / "typo").write_text('server_cert: "x"\nclient_verfy: true\n')
    with pytest.raises(TrainserveError, match=r"line 2:1 .*expected a SSLConfig text proto"):
        load_ssl_config(tmp_path / "typo")
    with pytest.raises(TrainserveError, match="cannot be read"):
        load_ssl_config(tmp_path / "absent")


def test_a_bad_ssl_config_stops_serve_local_before_models_load_or_ports_open(tmp_path, pki, model_versions):
    """A process: the exit code and the one line; the model is loadable, so only the config stops it."""
    install_version(model_versions[0], tmp_path / "m", 1)
    config = ssl_config(tmp_path / "ssl.config", pki, True, **mismatched(pki))
    port, rest_port = free_port(), free_port()
    proc = run_cli(
        "serve-local",
        f"--port={port}",
        f"--rest_api_port={rest_port}",
        "--model_name=m",
        f"--model_base_path={tmp_path / 'm'}",
        f"--ssl_config_file={config}",
        timeout=120,
    )
    assert_one_line_error(proc, "server_key is not the key of server_cert")
    assert proc.returncode == 2
    assert "waiting for m" not in proc.stderr and "Running gRPC" not in proc.stderr
    for taken in (port, rest_port):
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", taken)) != 0, f"port {taken} is open"


# --- bad inputs at start: the client's files ------------------------------------------------------------------


@pytest.mark.parametrize(
    "files, fragment",
    [
        (lambda pki: (pki.root / "absent.crt", None, None), "--tls-ca {root}/absent.crt cannot be read"),
        (lambda pki: (pki.ca_crt, pki.client_crt, None), "--tls-cert without --tls-key"),
        (lambda pki: (pki.ca_crt, None, pki.client_key), "--tls-key without --tls-cert"),
        (lambda pki: (pki.client_key, None, None), "--tls-ca {root}/client.key is not a valid PEM certificate"),
        (lambda pki: (pki.ca_crt, pki.client_crt, pki.stranger_key), "is not the key of --tls-cert"),
        (lambda pki: (pki.ca_crt, pki.client_crt, pki.ca_crt), "is not a valid PEM private key"),
        (lambda pki: (pki.der, None, None), "holds no PEM block"),
    ],
    ids=["unreadable", "cert-without-key", "key-without-cert", "key-as-ca", "key-of-another", "cert-as-key", "der"],
)
def test_bad_client_files_are_one_line_naming_the_flag(pki, files, fragment):
    (pki.root / "der").write_bytes(b"\x30\x82\x01\x0a" + bytes(20))
    with pytest.raises(TrainserveError) as err:
        ClientTls(*files(pki)).credentials()
    assert fragment.format(root=pki.root) in str(err.value) and "\n" not in str(err.value)


def test_an_encrypted_client_key_is_named_not_prompted_for(pki, tmp_path):
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(pki.client_key.read_bytes(), None)
    encrypted = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(b"pw")
    )
    path = write(tmp_path, "encrypted.key", encrypted)
    with pytest.raises(TrainserveError, match="is encrypted: expected an unencrypted"):
        ClientTls(pki.ca_crt, pki.client_crt, path).credentials()


def test_a_server_name_without_tls_is_refused():
    with pytest.raises(TrainserveError, match="--tls-server-name needs TLS"):
        open_channel("127.0.0.1:1", ClientTls(server_name="serving"))
