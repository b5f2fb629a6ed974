"""serve-cpu's entrypoint.sh and healthcheck.sh, run with bash on this machine (no Docker): which models
config is in force, what the server is started with, and what "ready" and "live" mean. The e2e tests run
the same scripts inside the image."""

from __future__ import annotations

import json
import os
import runpy
import shutil
import socket
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from google.protobuf import text_format

from conftest import REPO, free_port
from trainserve.protos import ssl_config_pb2
from trainserve.serving.config import parse_model_config
from trainserve.serving.tls import load_ssl_config

pytestmark = pytest.mark.unit

SERVE_CPU = REPO / "images" / "serve-cpu"
FAKE_SERVER = """#!/usr/bin/env bash
printf '%s\\n' "$@" >"$FAKE_ARGS"
"""


@pytest.fixture
def box(tmp_path) -> dict:
    """The image's paths, moved under tmp_path; tensorflow_model_server records its arguments."""
    for name in ("etc", "run", "bin"):
        (tmp_path / name).mkdir()
    for name in ("batching.config", "monitoring.config"):
        shutil.copy(SERVE_CPU / name, tmp_path / "etc" / name)
    server = tmp_path / "bin" / "tensorflow_model_server"
    server.write_text(FAKE_SERVER)
    server.chmod(0o755)
    return {
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "TRAINSERVE_LIB": str(SERVE_CPU),
        "TRAINSERVE_CONFIG_DIR": str(tmp_path / "etc"),
        "TRAINSERVE_RUN_DIR": str(tmp_path / "run"),
        "TRAINSERVE_TLS_DIR": str(tmp_path / "tls"),  # absent unless a test mounts a certificate there
        "FAKE_ARGS": str(tmp_path / "args"),
        "MODEL_NAME": "digits",
    }


def entrypoint(env: dict, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [SERVE_CPU / "entrypoint.sh"], env={**env, **extra}, capture_output=True, text=True, timeout=30
    )


def server_flags(env: dict) -> dict[str, str]:
    lines = Path(env["FAKE_ARGS"]).read_text().splitlines()
    return dict(line.removeprefix("--").split("=", 1) for line in lines)


def healthcheck(env: dict, *args: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [SERVE_CPU / "healthcheck.sh", *args], env={**env, **extra}, capture_output=True, text=True, timeout=30
    )


MULTI = """
# two models; a comment naming name: "ghost" is not one
model_config_list {
  config { name: "digits" base_path: "/models/digits" model_platform: "tensorflow" }
  config {
    name:'cats'
    base_path: "/models/cats"
    logging_config { log_collector_config { type: "x" filename_prefix: "not-a-model" } }
  }
}
"""


def test_without_a_mounted_config_model_name_is_served_from_its_directory(box):
    proc = entrypoint(box, MODEL_NAME="cats")
    assert proc.returncode == 0, proc.stderr
    flags = server_flags(box)
    generated = Path(box["TRAINSERVE_RUN_DIR"]) / "models.config"
    assert flags["model_config_file"] == str(generated)
    (model,) = parse_model_config(generated).model_config_list.config
    assert (model.name, model.base_path, model.model_version_policy.latest.num_versions) == ("cats", "/models/cats", 2)
    assert flags["batching_parameters_file"] == f"{box['TRAINSERVE_CONFIG_DIR']}/batching.config"
    assert "serving model 'cats' from /models/cats" in proc.stderr
    assert "ssl_config_file" not in flags, "no certificate mounted: plaintext, as before"


def test_a_mounted_config_rules_and_model_name_is_not_used(box):
    mounted = Path(box["TRAINSERVE_CONFIG_DIR"]) / "models.config"
    mounted.write_text(MULTI)
    proc = entrypoint(box, MODEL_NAME="cats")
    assert proc.returncode == 0, proc.stderr
    assert server_flags(box)["model_config_file"] == str(mounted)
    assert not (Path(box["TRAINSERVE_RUN_DIR"]) / "models.config").exists()
    assert f"serving the models named in {mounted}: digits cats (MODEL_NAME is not used)" in proc.stderr
    # MODEL_CONFIG_FILE points elsewhere: that file rules.
    elsewhere = mounted.parent.parent / "mine.config"
    elsewhere.write_text(MULTI)
    assert entrypoint(box, MODEL_CONFIG_FILE=str(elsewhere)).returncode == 0
    assert server_flags(box)["model_config_file"] == str(elsewhere)
    missing = entrypoint(box, MODEL_CONFIG_FILE=str(mounted.parent / "nope.config"))
    assert missing.returncode == 64 and "cannot read the model config" in missing.stderr


@pytest.mark.parametrize("name", ["", "ca ts", 'ca"ts', "../etc", ".hidden", "a/b", "x}"])
def test_a_model_name_that_is_not_a_directory_name_stops_the_start(box, name):
    proc = entrypoint(box, MODEL_NAME=name)
    assert proc.returncode == 64 and "MODEL_NAME" in proc.stderr and "expected letters" in proc.stderr
    assert not Path(box["FAKE_ARGS"]).exists(), "the server was not started"


def test_an_unwritable_run_dir_is_named(box, tmp_path):
    proc = entrypoint(box, TRAINSERVE_RUN_DIR=str(tmp_path / "etc" / "batching.config" / "sub"))
    assert proc.returncode == 64 and "writable /tmp" in proc.stderr


class FakeRest:
    """TF Serving's REST model status, with states set per model; unknown models are HTTP 404."""

    def __init__(self):
        self.states: dict[str, str] = {}
        states = self.states

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                name = self.path.removeprefix("/v1/models/")
                if name not in states:
                    self.send_response(404)
                    body = {"error": f"Servable not found for request: Latest({name})"}
                else:
                    self.send_response(200)
                    body = {"model_version_status": [{"version": "1", "state": states[name]}]}
                self.end_headers()
                self.wfile.write(json.dumps(body, indent=1).encode())

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = str(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def rest():
    server = FakeRest()
    yield server
    server.close()


def test_ready_means_every_configured_model_has_a_version_available(box, rest):
    # Generated config: follows MODEL_NAME.
    assert entrypoint(box, MODEL_NAME="cats").returncode == 0
    rest.states.update(digits="AVAILABLE", cats="LOADING")
    check = healthcheck(box, "ready", MODEL_NAME="cats", REST_PORT=rest.port)
    assert check.returncode == 1 and "cats: no version AVAILABLE" in check.stdout
    rest.states["cats"] = "AVAILABLE"
    assert healthcheck(box, MODEL_NAME="cats", REST_PORT=rest.port).returncode == 0, "`ready` is the default"
    # A mounted config: every model it names, whatever MODEL_NAME says.
    (Path(box["TRAINSERVE_CONFIG_DIR"]) / "models.config").write_text(MULTI)
    del rest.states["digits"]
    check = healthcheck(box, "ready", MODEL_NAME="cats", REST_PORT=rest.port)
    assert check.returncode == 1 and "digits: no version AVAILABLE" in check.stdout
    rest.states["digits"] = "AVAILABLE"
    check = healthcheck(box, "ready", MODEL_NAME="cats", REST_PORT=rest.port)
    assert check.returncode == 0 and check.stdout.strip() == "serving: digits cats"


def test_ready_fails_while_nothing_listens_or_no_config_exists_yet(box, rest):
    rest.states["digits"] = "AVAILABLE"
    check = healthcheck(box, "ready", REST_PORT=rest.port)
    assert check.returncode == 1 and "no model named" in check.stdout, "before the entrypoint wrote its config"
    assert entrypoint(box).returncode == 0
    assert healthcheck(box, "ready", REST_PORT=rest.port).returncode == 0
    assert healthcheck(box, "ready", REST_PORT=str(free_port())).returncode == 1


def test_live_is_true_while_the_server_waits_with_closed_ports(box):
    # tensorflow_model_server opens its ports only once the initial models are AVAILABLE: a pod waiting
    # for the first training must not be killed.
    assert entrypoint(box).returncode == 0
    check = healthcheck(box, "live", REST_PORT=str(free_port()))
    assert check.returncode == 0 and "waiting" in check.stdout


def test_live_needs_an_answer_once_the_port_is_open(box, rest):
    assert entrypoint(box).returncode == 0
    check = healthcheck(box, "live", REST_PORT=rest.port)  # digits unknown: a 404 is still an answer
    assert check.returncode == 0 and check.stdout.startswith("answering: HTTP/1.0 404")
    with socket.socket() as hung:  # listens (the kernel completes connections) but never answers
        hung.bind(("127.0.0.1", 0))
        hung.listen(8)
        check = healthcheck(box, "live", REST_PORT=str(hung.getsockname()[1]))
    assert check.returncode == 1 and "no HTTP answer" in check.stdout


def test_an_unknown_mode_is_a_usage_error(box):
    check = healthcheck(box, "alive")
    assert check.returncode == 2 and "usage" in check.stderr


# --- gRPC over TLS from a mounted kubernetes.io/tls Secret (tls-config.sh) ------------------------------------

certs = runpy.run_path(str(REPO / "scripts" / "certs.py"))  # what `make certs` runs


def mount_tls(box: dict, with_ca: bool = True) -> Path:
    """tls.crt, tls.key (and ca.crt) as a kubernetes.io/tls Secret mounts them."""
    ca = certs["make_ca"]()
    directory = certs["write_pair"](
        Path(box["TRAINSERVE_TLS_DIR"]), certs["issue"](ca, "serve-cpu", ["serve-cpu"]), ca[0]
    )
    if not with_ca:
        (directory / "ca.crt").unlink()
    return directory


def test_a_mounted_certificate_becomes_an_ssl_config_that_tf_serving_parses(box):
    tls = mount_tls(box)
    proc = entrypoint(box)
    assert proc.returncode == 0, proc.stderr
    path = Path(server_flags(box)["ssl_config_file"])
    config = text_format.Parse(path.read_text(), ssl_config_pb2.SSLConfig())  # the real message, strictly
    assert config.server_cert == (tls / "tls.crt").read_text() and config.server_key == (tls / "tls.key").read_text()
    assert config.custom_ca == (tls / "ca.crt").read_text() and config.client_verify
    assert load_ssl_config(path).client_verify, "serve-local accepts it: the key is the certificate's"
    assert path.stat().st_mode & 0o077 == 0, "the file holds the private key"
    assert "gRPC over TLS" in proc.stderr and "client_verify: true" in proc.stderr


def test_without_a_ca_clients_are_not_asked_for_certificates_unless_required(box):
    mount_tls(box, with_ca=False)
    assert entrypoint(box).returncode == 0
    config = text_format.Parse(Path(server_flags(box)["ssl_config_file"]).read_text(), ssl_config_pb2.SSLConfig())
    assert not config.client_verify and not config.custom_ca
    proc = entrypoint(box, TLS_CLIENT_VERIFY="true")
    assert proc.returncode == 64 and "needs" in proc.stderr and "ca.crt" in proc.stderr


def test_a_half_mounted_secret_stops_the_start(box):
    (mount_tls(box) / "tls.key").unlink()
    Path(box["FAKE_ARGS"]).unlink(missing_ok=True)
    proc = entrypoint(box)
    assert proc.returncode == 64 and "tls.key is missing" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not Path(box["FAKE_ARGS"]).exists()
