"""The serve-cpu image over TLS on a real Docker engine (stand-in base: serve-local as tensorflow_model_server):
a certificate mounted where a kubernetes.io/tls Secret or compose.tls.yaml puts it turns gRPC into mutual TLS,
which `trainserve eval` (its command line, with a client certificate) evaluates through; the REST port
(healthcheck, status) stays plaintext; and the same image without a certificate serves plaintext as before.
One container start each."""

from __future__ import annotations

import json
import runpy
import time
import urllib.error
from pathlib import Path

import numpy as np
import pytest
from test_tls import predict, refusal

from conftest import DIRECT, REPO, free_port, install_version
from serving_fixtures import IMAGES
from trainserve.cli import main
from trainserve.savedmodel import LoadedModel
from trainserve.tls import ClientTls

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("docker")]  # one worker drives the engine

certs = runpy.run_path(str(REPO / "scripts" / "certs.py"))  # what `make certs` runs


def readable_by_the_image(path: Path) -> Path:
    """The image runs as uid 10001: the mounted files must be readable by others."""
    for item in [path, *path.rglob("*")]:
        item.chmod(0o755 if item.is_dir() else 0o644)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory, model_versions) -> Path:
    root = tmp_path_factory.mktemp("e2e-tls-models")
    install_version(model_versions[0], root / "m", 1)
    return readable_by_the_image(root)


def rest_versions(port: int) -> dict:
    try:
        with DIRECT.open(f"http://127.0.0.1:{port}/v1/models/m", timeout=5) as response:
            return {int(v["version"]): v["state"] for v in json.loads(response.read())["model_version_status"]}
    except (OSError, urllib.error.URLError, ValueError):
        return {}


def run_serving(client, image: str, models: Path, tls_dir: Path | None):
    """serve-cpu with MODEL_NAME=m; returns (container, gRPC target) once m v1 is AVAILABLE (over REST)."""
    grpc_port, rest_port = free_port(), free_port()
    volumes = {str(models): {"bind": "/models", "mode": "ro"}}
    if tls_dir is not None:
        volumes[str(tls_dir)] = {"bind": "/etc/trainserve/tls", "mode": "ro"}
    container = client.containers.run(
        image,
        detach=True,
        environment={"MODEL_NAME": "m"},
        volumes=volumes,
        ports={"8500/tcp": ("127.0.0.1", grpc_port), "8501/tcp": ("127.0.0.1", rest_port)},
    )
    deadline = time.monotonic() + 180
    while rest_versions(rest_port).get(1) != "AVAILABLE":
        container.reload()
        assert container.status in ("created", "running"), container.logs().decode()[-3000:]
        assert time.monotonic() < deadline, f"m v1 not AVAILABLE:\n{container.logs().decode()[-3000:]}"
        time.sleep(0.25)
    return container, f"127.0.0.1:{grpc_port}"


def stop(container) -> None:
    container.stop(timeout=5)
    container.remove(force=True)


def test_a_mounted_certificate_serves_grpc_over_mutual_tls_and_rest_stays_plaintext(
    docker_client, docker_images, models, model_versions, tmp_path
):
    ca = certs["make_ca"]()
    server = readable_by_the_image(
        certs["write_pair"](tmp_path / "server", certs["issue"](ca, "serve-cpu", ["serve-cpu"]), ca[0])
    )  # only the compose/k8s service name: the client names it, reaching the container by address
    client = certs["write_pair"](tmp_path / "client", certs["issue"](ca, "eval", client=True), ca[0])
    container, target = run_serving(docker_client, docker_images["serve-cpu"], models, server)
    try:
        mutual = ClientTls(client / "ca.crt", client / "tls.crt", client / "tls.key", server_name="serve-cpu")
        want = LoadedModel(model_versions[0]).run("serving_default", {"images": IMAGES})["probabilities"]
        np.testing.assert_allclose(predict(target, mutual), want, rtol=1e-5)
        evaluated = tmp_path / "eval.json"
        np.savez(tmp_path / "test.npz", x_test=IMAGES, y_test=want.argmax(axis=1))
        code = main(
            [
                "eval",
                "--server",
                target,
                "--model",
                "m",
                "--data",
                str(tmp_path / "test.npz"),
                "--report",
                str(evaluated),
                *("--tls-ca", f"{client}/ca.crt", "--tls-cert", f"{client}/tls.crt", "--tls-key", f"{client}/tls.key"),
                *("--tls-server-name", "serve-cpu"),
            ]
        )
        report = json.loads(evaluated.read_text())
        assert code == 0 and report["metrics"]["accuracy"] == 1.0, "labels are the model's own answers"
        assert "requires TLS" in refusal(target, ClientTls())
        without_certificate = ClientTls(client / "ca.crt", server_name="serve-cpu")
        assert "requires a client certificate" in refusal(target, without_certificate)
        health = container.exec_run(["/usr/local/bin/healthcheck.sh", "ready"])
        assert health.exit_code == 0, health.output  # over REST, which TLS leaves plaintext
        assert "gRPC over TLS" in container.logs().decode() and "client_verify: true" in container.logs().decode()
    finally:
        stop(container)


def test_without_a_certificate_the_image_serves_plaintext(docker_client, docker_images, models):
    container, target = run_serving(docker_client, docker_images["serve-cpu"], models, None)
    try:
        assert predict(target, ClientTls()).shape[0] == len(IMAGES)
        assert "gRPC over TLS" not in container.logs().decode()
    finally:
        stop(container)
