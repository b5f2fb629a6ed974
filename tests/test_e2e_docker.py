"""End to end on a real Docker engine: train-cpu -> serve-cpu -> eval -> version 2 -> down -v, under a
model name that is not the default: MODEL_NAME alone must name the model for all three stages.

The images are built from our unchanged Dockerfiles on locally made STAND-IN bases (no registry here):
TensorFlow CPU for tensorflow/tensorflow:<v>-gpu, serve-local as tensorflow_model_server. Users get the
real base images. Without a Docker engine these tests skip locally; under CI (CI=true) they fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
from pathlib import Path

import pytest

from conftest import DIRECT, REPO, free_port
from conftest import TF_VERSION_ENV as TF_VERSION

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("docker")]  # one worker drives the engine

PROJECT = "trainserve-e2e"
MODEL = "cats"  # not the images' default (digits): only MODEL_NAME tells serve-cpu what to serve
UID = "10001"
SMOKE = """
import sys, numpy as np
from pathlib import Path
from trainserve.savedmodel import LoadedModel
out = LoadedModel(Path(sys.argv[1])).run("serving_default", {"x": np.array([1.0, 2.0], np.float32)})
print(out["y"].tolist())
"""


@pytest.fixture(scope="module")
def env(docker_images) -> dict:
    """Our three images built on the stand-in bases (once per session), and a compose environment."""
    return {
        **os.environ,
        "TF_VERSION": TF_VERSION,
        "COMPOSE_PROJECT_NAME": PROJECT,
        "GRPC_PORT": str(free_port()),
        "REST_PORT": str(free_port()),
        "EPOCHS": "5",  # the default CNN passes 0.9 on the digits in 5 epochs (test_model.py)
    }


def compose(env: dict, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    binary = str(Path(os.sys.executable).parent / "docker-compose")
    proc = subprocess.run([binary, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, f"docker compose {' '.join(args)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def container(client, service: str):
    (found,) = client.containers.list(
        all=True, filters={"label": [f"com.docker.compose.project={PROJECT}", f"com.docker.compose.service={service}"]}
    )
    return found


def wait_until(predicate, what: str, timeout: float = 120):
    """Polls every quarter second: each look is one engine or REST call, and a wait ends that much sooner."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def health(client, service: str) -> str:
    found = container(client, service)
    found.reload()
    return found.attrs["State"].get("Health", {}).get("Status", "none")


def failed_health_checks(found) -> int:
    """Health checks Docker has run on the container so far, each of which must have failed (not serving yet)."""
    found.reload()
    checks = (found.attrs["State"].get("Health") or {}).get("Log") or []
    assert all(check["ExitCode"] != 0 for check in checks), checks
    return len(checks)


def rest_status(env: dict, model: str) -> dict:
    try:
        with DIRECT.open(f"http://127.0.0.1:{env['REST_PORT']}/v1/models/{model}", timeout=5) as response:
            return {int(v["version"]): v["state"] for v in json.loads(response.read())["model_version_status"]}
    except (OSError, urllib.error.URLError):
        return {}


def test_train_serve_eval_and_a_second_version_without_restart(docker_client, env):
    env = {**env, "MODEL_NAME": MODEL}  # as a user's .env would say it (the environment overrides .env)
    try:
        # 1. Serving before any model exists: waits, says why, unhealthy, no crash loop; alive all along.
        compose(env, "up", "-d", "serve-cpu")
        serve = container(docker_client, "serve-cpu")
        wait_until(lambda: "no version published yet" in serve.logs().decode(), "serve-cpu to log the wait", 60)
        # compose keeps the serving config on the `rollout` volume (gated rollout), started from MODEL_NAME
        logs = serve.logs().decode()
        assert f"started the rollout config /rollout/models.config from MODEL_NAME '{MODEL}'" in logs, logs
        assert f"serving the models named in /rollout/models.config: {MODEL}" in logs, logs
        wait_until(lambda: failed_health_checks(serve) >= 1, "a health check while it waits", 60)
        assert serve.status == "running" and serve.attrs["RestartCount"] == 0
        assert health(docker_client, "serve-cpu") != "healthy"
        live = serve.exec_run(["/usr/local/bin/healthcheck.sh", "live"])
        assert live.exit_code == 0 and b"waiting" in live.output, "k8s liveness passes while the server waits"

        # 2. Train on the CPU: version 1 lands in the shared volume.
        trained = compose(env, "--profile", "train", "run", "--rm", "train-cpu")
        assert f"published {MODEL} version 1" in trained.stdout

        # 3. The same container picks it up and turns healthy.
        wait_until(lambda: health(docker_client, "serve-cpu") == "healthy", "serve-cpu healthy", 90)
        assert rest_status(env, MODEL) == {1: "AVAILABLE"}
        live = serve.exec_run(["/usr/local/bin/healthcheck.sh", "live"])
        assert live.exit_code == 0 and b"answering: HTTP/1" in live.output

        # 4. Evaluate over gRPC from the eval container; the report meets the threshold.
        evaluated = compose(env, "--profile", "eval", "run", "--rm", "eval")
        assert "gate" in evaluated.stdout and "PASS" in evaluated.stdout
        report = json.loads(
            compose(
                env,
                "--profile",
                "eval",
                "run",
                "--rm",
                "--no-deps",
                "--entrypoint",
                "cat",
                "eval",
                "/reports/eval.json",
            ).stdout
        )
        assert report["model"] == MODEL and report["version"] == 1
        assert report["metrics"]["accuracy"] >= 0.9 and report["passed"]
        # 388: the digits that model "cats"'s salt holds out (trainserve.hashed_split; 355 for model "digits")
        assert report["data"]["examples"] == 388, "eval read exactly the split training held out"

        # 5. A second training: version 2 is served by the same, never restarted, container (one epoch: what is
        # under test is the pick-up, not the model).
        started = serve.attrs["State"]["StartedAt"]
        retrained = compose({**env, "EPOCHS": "1"}, "--profile", "train", "run", "--rm", "train-cpu").stdout
        assert f"published {MODEL} version 2" in retrained
        wait_until(lambda: rest_status(env, MODEL).get(2) == "AVAILABLE", "version 2 AVAILABLE", 60)
        serve.reload()
        assert serve.attrs["State"]["StartedAt"] == started and serve.attrs["RestartCount"] == 0

        # 6. Hardening: non-root everywhere, read-only models, loopback-only ports.
        assert serve.exec_run("id -u").output.decode().strip() == UID
        touch = serve.exec_run(f"touch /models/{MODEL}/intruder")
        assert touch.exit_code != 0 and b"Read-only file system" in touch.output
        for service in ("train-cpu", "eval"):
            profile = "train" if service.startswith("train") else "eval"
            who = compose(env, "--profile", profile, "run", "--rm", "--no-deps", "--entrypoint", "id", service, "-u")
            assert who.stdout.strip() == UID, service
        bindings = serve.attrs["NetworkSettings"]["Ports"]
        assert {b["HostIp"] for port in ("8500/tcp", "8501/tcp") for b in bindings[port]} == {"127.0.0.1"}
    finally:
        compose(env, "--profile", "train", "--profile", "eval", "down", "-v", "--remove-orphans", check=False)
    assert not docker_client.volumes.list(filters={"label": f"com.docker.compose.project={PROJECT}"})


@pytest.fixture(scope="module")
def smoke_model(tmp_path_factory) -> Path:
    """A tiny known model: y = 2x + 1 on float32 vectors."""
    import tensorflow as tf

    class Affine(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        def serve(self, x):
            return {"y": 2.0 * x + 1.0}

    root = tmp_path_factory.mktemp("smoke")
    module = Affine()
    tf.saved_model.save(module, str(root / "digits" / "1"), signatures={"serving_default": module.serve})
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)  # readable by the images' non-root user
    return root


@pytest.mark.parametrize("image", ["train-gpu"])  # the eval image holds no TensorFlow: see the next test
def test_python_images_compute_the_known_answer(docker_client, env, smoke_model, image):
    out = docker_client.containers.run(
        f"trainserve/{image}:{TF_VERSION}",
        ["-c", SMOKE, "/smoke/digits/1"],
        entrypoint="python3",
        volumes={str(smoke_model): {"bind": "/smoke", "mode": "ro"}},
        remove=True,
    )
    assert out.decode().strip().splitlines()[-1] == "[3.0, 5.0]"


def test_eval_image_is_the_core_install_without_tensorflow(docker_client, env):
    heavy = "('tensorflow', 'tensorflow_serving', 'keras', 'sklearn')"
    check = f"import importlib.util as u; print([m for m in {heavy} if u.find_spec(m)])"
    out = docker_client.containers.run(
        f"trainserve/eval:{TF_VERSION}", ["-c", check], entrypoint="python3", remove=True
    )
    assert out.decode().strip().splitlines()[-1] == "[]"


EVAL_IMAGE_LIMIT = 300_000_000  # bytes, on the stand-in base (363 MB when it carried pip and byte-code caches)
WHAT_SHIPS = """
import importlib.util, json, shutil, sys
from pathlib import Path
print(json.dumps({
    "installers": [m for m in ("pip", "setuptools", "wheel") if importlib.util.find_spec(m) or shutil.which(m)],
    "caches": [str(p) for p in [*Path(sys.prefix).rglob("__pycache__"), Path("/root/.cache")] if p.exists()],
}))
"""


def test_eval_image_carries_only_what_runs(docker_client, env):
    tag = f"trainserve/eval:{TF_VERSION}"
    size = docker_client.images.get(tag).attrs["Size"]
    assert size <= EVAL_IMAGE_LIMIT, f"{tag} is {size / 1e6:.0f} MB: expected <= {EVAL_IMAGE_LIMIT / 1e6:.0f} MB"
    out = docker_client.containers.run(tag, ["-c", WHAT_SHIPS], entrypoint="python3", user="0", remove=True)
    assert json.loads(out.decode().strip().splitlines()[-1]) == {"installers": [], "caches": []}


def test_serving_image_answers_the_known_model(docker_client, env, smoke_model):
    rest = free_port()
    serve = docker_client.containers.run(
        f"trainserve/serve-cpu:{TF_VERSION}",
        detach=True,
        read_only=True,
        tmpfs={"/tmp": ""},
        volumes={str(smoke_model): {"bind": "/models", "mode": "ro"}},
        ports={"8501/tcp": ("127.0.0.1", rest)},
        nano_cpus=1_000_000_000,
    )
    try:
        wait_until(lambda: (serve.reload() or serve.attrs["State"]["Health"]["Status"]) == "healthy", "healthy", 90)
        assert "CPU limit 1; intra-op 1, inter-op 1" in serve.logs().decode(), "threads sized from the CPU limit"
        request = urllib_request(f"http://127.0.0.1:{rest}/v1/models/digits:predict", {"instances": [1.0, 2.0]})
        with DIRECT.open(request, timeout=10) as response:
            assert json.loads(response.read()) == {"predictions": [3.0, 5.0]}
    finally:
        serve.remove(force=True)


def test_a_mounted_models_config_rules_and_health_follows_every_model(docker_client, env, smoke_model, tmp_path):
    """A mounted models.config names two models, one not published yet: serve-cpu waits (alive, not
    healthy), and turns healthy only when both have a version AVAILABLE. MODEL_NAME is not used."""
    models = tmp_path / "models"
    shutil.copytree(smoke_model / "digits", models / "digits")
    (tmp_path / "models.config").write_text(
        "model_config_list {\n"
        '  config { name: "digits" base_path: "/models/digits" model_platform: "tensorflow" }\n'
        '  config { name: "affine" base_path: "/models/affine" model_platform: "tensorflow" }\n'
        "}\n"
    )
    for path in [tmp_path, *tmp_path.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    rest = free_port()
    serve = docker_client.containers.run(
        f"trainserve/serve-cpu:{TF_VERSION}",
        detach=True,
        read_only=True,
        tmpfs={"/tmp": ""},
        environment={"MODEL_NAME": "unused"},
        ports={"8501/tcp": ("127.0.0.1", rest)},
        volumes={
            str(models): {"bind": "/models", "mode": "ro"},
            str(tmp_path / "models.config"): {"bind": "/etc/trainserve/models.config", "mode": "ro"},
        },
    )
    try:
        wait_until(lambda: "digits affine (MODEL_NAME is not used)" in serve.logs().decode(), "the config's models", 60)
        wait_until(lambda: failed_health_checks(serve) >= 1, "a health check while affine has no version", 60)
        assert serve.status == "running" and serve.attrs["State"]["Health"]["Status"] != "healthy"
        assert serve.exec_run(["/usr/local/bin/healthcheck.sh", "ready"]).exit_code == 1
        assert serve.exec_run(["/usr/local/bin/healthcheck.sh", "live"]).exit_code == 0
        # Publish `affine` version 1 as training does: a non-numeric directory, renamed once complete.
        shutil.copytree(smoke_model / "digits" / "1", models / "affine" / ".tmp-1")
        for path in [models / "affine", *(models / "affine").rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        (models / "affine" / ".tmp-1").rename(models / "affine" / "1")
        wait_until(lambda: (serve.reload() or serve.attrs["State"]["Health"]["Status"]) == "healthy", "healthy", 90)
        assert serve.exec_run(["/usr/local/bin/healthcheck.sh", "ready"]).output.decode().strip() == (
            "serving: digits affine"
        )
        request = urllib_request(f"http://127.0.0.1:{rest}/v1/models/affine:predict", {"instances": [1.0, 2.0]})
        with DIRECT.open(request, timeout=10) as response:
            assert json.loads(response.read()) == {"predictions": [3.0, 5.0]}
    finally:
        serve.remove(force=True)


def urllib_request(url: str, body: dict):
    import urllib.request

    return urllib.request.Request(url, json.dumps(body).encode(), method="POST")
