"""Shared fixtures: a real tiny SavedModel, and a runner for the real `trainserve` CLI in a subprocess."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The suite's rollouts end at their promotion (`trainserve rollout --bake`, read from the environment by the command
# line and its subprocesses): the bake has its own tests (test_rollout_bake*.py), and would add its quarter hour to
# every other rollout.
os.environ.setdefault("TRAINSERVE_BAKE", "0")
REPO = Path(__file__).resolve().parents[1]
pytest_plugins = (
    "serving_fixtures",  # serve_in_process: serve-local on a thread of the test process
    "tier_budget",  # a unit test slower than its tier's budget fails, naming itself
)


# `trainserve load` flags for a short closed-loop sweep (one client, three short windows): tests of what the sweep
# reports, not of how fast anything is.
QUICK_SWEEP = ("--concurrency", "1", "--window-s", "0.2", "--max-windows", "3")


def target_flags(server: Server, model: str = "m", label: str | None = None) -> list[str]:
    """A client's flags naming the server and the model (and label) it asks for."""
    return ["--server", server.target, "--model", model, *(["--label", label] if label else [])]


def pinned_tf_version() -> str:
    """The one TensorFlow pin, from pyproject.toml's `cpu` extra."""
    import tomllib

    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["cpu"]
    return next(d.split("==")[1] for d in extra if d.startswith("tensorflow-cpu=="))


def require(what: str, available: bool, why: str) -> None:
    """Tests needing a host tool (a Docker engine, kubectl) skip on a laptop without it, never in CI."""
    if not available:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run these tests, but {what} is missing: {why}")
        pytest.skip(f"{what} is missing ({why}); CI runs these tests")


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 300):
    """`python -m trainserve ARGS` in a fresh process; returns the CompletedProcess (text)."""
    return subprocess.run(
        [sys.executable, "-m", "trainserve", *map(str, args)],
        cwd=cwd,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_one_line_error(proc, *fragments: str) -> str:
    """Non-zero exit, no traceback, and a last stderr line that names what was expected."""
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert "error:" in line, proc.stderr
    for fragment in fragments:
        assert fragment in line, line
    return line


TIERS = ("unit", "integration", "e2e")


def pytest_collection_modifyitems(config, items):
    """Every test names exactly one tier (what it needs), so `-m unit` is a complete fast tier. The slower tiers
    run first: xdist hands out tests in this order (`make test` passes --no-loadscope-reorder), and the many quick
    unit tests then fill the workers' last minutes instead of one worker finishing a long training while the
    others idle."""
    tiers = {item: [m.name for m in item.iter_markers() if m.name in TIERS] for item in items}
    wrong = [f"{item.nodeid}: {names or 'none'}" for item, names in tiers.items() if len(names) != 1]
    if wrong:
        raise pytest.UsageError(f"tests need exactly one tier marker of {', '.join(TIERS)}:\n  " + "\n  ".join(wrong))
    items.sort(key=lambda item: -TIERS.index(tiers[item][0]))  # stable: e2e, integration, then unit


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Loopback needs no proxy, and urllib's global opener may have cached one from the environment.
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


# serve-local's Prometheus endpoint on the REST port, where the tests count the requests a server answered.
MONITORING = "prometheus_config { enable: true }\n"


def serve_counted(root: Path, model: str, own_process: bool = False):
    """serve-local serving `root/<model>` (v1 installed), with Prometheus request counters (predict_count): on a
    thread of this process (`serving_fixtures.InProcessServer`), or in its own process where timing must not share
    this process's interpreter with the test's own clients."""
    from serving_fixtures import InProcessServer

    (root / "monitoring.config").write_text(MONITORING)
    flags = (
        f"--model_name={model}",
        f"--model_base_path={root / model}",
        f"--monitoring_config_file={root / 'monitoring.config'}",
    )
    server = ServeLocal(*flags, log_path=root / "server.log") if own_process else InProcessServer(*flags)
    server.wait_available(model, 1)
    return server


def predict_count(server: Server) -> int:
    """Predict calls the server has answered, from its Prometheus counters."""
    text = DIRECT.open(server.rest + "/monitoring/prometheus/metrics", timeout=10).read().decode()
    return sum(int(line.rsplit(" ", 1)[1]) for line in text.splitlines() if 'api="predict"' in line)


class Server:
    """What tests ask of a serve-local over REST, whether it runs in its own process (`ServeLocal`) or on a
    thread of this one (`serving_fixtures.InProcessServer`)."""

    rest: str

    def ended(self) -> str | None:
        """None while it serves; else how it ended."""
        raise NotImplementedError

    def log(self) -> str:
        raise NotImplementedError

    def stop(self) -> int | None:
        raise NotImplementedError

    def get(self, path: str) -> tuple[int, dict]:
        try:
            with DIRECT.open(self.rest + path, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    def post(self, path: str, body: dict) -> tuple[int, dict]:
        request = urllib.request.Request(self.rest + path, json.dumps(body).encode(), method="POST")
        try:
            with DIRECT.open(request, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    def wait_for(self, predicate, what: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ended = self.ended()
            assert ended is None, f"serve-local {ended}:\n{self.log()}"
            try:
                if predicate():
                    return
            except (OSError, urllib.error.URLError, ValueError):
                pass
            time.sleep(0.1)
        log = self.log()
        self.stop()  # a fixture that fails in setup gets no teardown: never leave the server behind
        raise AssertionError(f"timed out waiting for {what}:\n{log}")

    def versions(self, model: str) -> dict[int, str]:
        status, body = self.get(f"/v1/models/{model}")
        return {int(v["version"]): v["state"] for v in body.get("model_version_status", [])} if status == 200 else {}

    def wait_available(self, model: str, version: int, timeout: float = 90) -> None:
        self.wait_for(lambda: self.versions(model).get(version) == "AVAILABLE", f"{model} v{version}", timeout)


class ServeLocal(Server):
    """A real `trainserve serve-local` subprocess on ephemeral ports."""

    def __init__(self, *flags: str, log_path: Path):
        self.port, self.rest_port = free_port(), free_port()
        self.log_path = log_path
        self._log = open(log_path, "w")  # noqa: SIM115  (open as long as the server runs; closed in stop())
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trainserve",
                "serve-local",
                f"--port={self.port}",
                f"--rest_api_port={self.rest_port}",
                "--file_system_poll_wait_seconds=1",
                *flags,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        )
        self.target = f"127.0.0.1:{self.port}"
        self.rest = f"http://127.0.0.1:{self.rest_port}"

    def ended(self) -> str | None:
        return None if self.proc.poll() is None else f"exited ({self.proc.returncode})"

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


@pytest.fixture
def serve_local(tmp_path):
    """Start serve-local processes with given flags; every one is stopped (SIGTERM) at teardown."""
    servers = []

    def start(*flags: str) -> ServeLocal:
        server = ServeLocal(*flags, log_path=tmp_path / f"serve-local-{len(servers)}.log")
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def share_split(dataset, data_dir: Path, model: str) -> Path:
    """The held-out split shared as `trainserve train` shares it (splits/<fingerprint>.npz and the newest
    test.npz); returns the newest."""
    from trainserve.splits import HeldOutSplit, provenance

    origin = provenance("test", 0, 0.2)
    HeldOutSplit(dataset.test, dataset.y_test, dataset.task, dataset.single, origin).share(data_dir, model)
    return data_dir / model / "test.npz"


def record_version(version_dir: Path, data_dir: Path, model: str, inputs: dict, labels, origin: dict) -> Path:
    """What `trainserve train --data-dir` leaves for eval beside a published version: its held-out split and its
    record (with the SHA-256 of its files), written through the production path; returns the record."""
    import time

    from trainserve.layout import version_files_sha256
    from trainserve.splits import HeldOutSplit, write_version_record
    from trainserve.task import Task

    task = Task("classification", classes=int(np.max(labels)) + 1)
    split = HeldOutSplit(inputs, np.asarray(labels), task, len(inputs) == 1, origin)
    split.share(data_dir, model)
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    metadata = {
        "model_name": model,
        "task": task.to_json(),
        "created": created,
        "data": {"test_split": split.record(True)},
    }
    files = version_files_sha256(version_dir)
    return write_version_record(data_dir, model, int(version_dir.name), metadata, files)


def digits_spec():
    """The built-in CNN's data as `trainserve train` sees 8x8 digits: uint8 `images`, 10 classes."""
    from trainserve.task import Task
    from trainserve.training.model_fn import DataSpec, InputSpec

    return DataSpec((InputSpec("images", (8, 8, 1), "uint8"),), Task("classification", classes=10))


def digits_cnn():
    """The built-in CNN for 8x8x1 digits, uncompiled, as training builds it."""
    from trainserve.training.model import build_network

    return build_network("cnn", digits_spec())


def export_digits_cnn(model, path: Path) -> Path:
    """`model` exported with the signature `trainserve train` gives digits (images in, probabilities out)."""
    from trainserve.training.export import export_savedmodel

    spec = digits_spec()
    export_savedmodel(model, path, spec.inputs, spec.task)
    return path


@pytest.fixture(scope="session")
def model_versions(tmp_path_factory) -> list[Path]:
    """Three exports of the same 8x8x1 CNN with different weights: distinct answers per version."""
    import keras

    from trainserve.layout import write_warmup_requests

    root = tmp_path_factory.mktemp("versions")
    images = np.random.default_rng(0).integers(0, 256, (8, 8, 8, 1), dtype=np.uint8)
    paths = []
    for seed in range(3):
        keras.utils.set_random_seed(seed)
        path = root / f"seed{seed}"
        export_digits_cnn(digits_cnn(), path)
        write_warmup_requests(path, "m", {"images": images})
        paths.append(path)
    return paths


@pytest.fixture(scope="session")
def trained_digits(tmp_path_factory, worker_id) -> Path:
    """The default model trained 5 epochs on the bundled digits and published, once per test session (xdist
    workers share it): ROOT/models/digits/1, ROOT/data/digits/test.npz, ROOT/logs/ (run_summary.json, ...).
    Read-only: a test that changes it copies it first."""
    return once_per_session(tmp_path_factory, worker_id, "trained-digits", _train_digits)


# xdist makes a module- or session-scoped fixture once per worker that runs one of its tests. What every worker
# needs and can share read-only (the trained digits, the Docker images) is made once behind a lock
# (once_per_session). A module whose own fixture trains or starts servers carries xdist_group("<name>") instead,
# so one worker runs it whole (`make test` distributes with --dist loadgroup) and the fixture is made once.
def once_per_session(tmp_path_factory, worker_id: str, name: str, make) -> Path:
    """`make(root)` once per test session, by whichever xdist worker asks first; the others wait on a lock and
    reuse `root`."""
    import fcntl
    import shutil

    base = tmp_path_factory.getbasetemp()
    root = (base if worker_id == "master" else base.parent) / name  # the parent: one per session
    with open(f"{root}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "done").is_file():
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir(parents=True)
            make(root)
            (root / "done").touch()
    return root


def _train_digits(root: Path) -> None:
    """`trainserve train --epochs 5` in this process: the CLI's own function, without a second TensorFlow start."""
    from trainserve.training.config import TrainConfig
    from trainserve.training.run import train

    result = train(TrainConfig(epochs=5, export_base=root / "models", data_dir=root / "data", logs_dir=root / "logs"))
    assert result.version == 1, result


@pytest.fixture(scope="session")
def tiny_savedmodel(model_versions) -> Path:
    """A real trainserve-style export (untrained 8x8x1 CNN) with warmup requests."""
    return model_versions[0]


def save_foreign_model(path: Path, pin_device: str | None = None) -> Path:
    """A SavedModel not made by trainserve: two inputs of different dtypes, a dict of outputs, and a
    `slow` signature whose run time grows with its `steps` input. `pin_device` pins `serve`'s math."""
    import tensorflow as tf

    # autograph=False: the functions' Python is already graph code, and autograph's cache of converted methods
    # of a class made per call once handed `serve` without its `self` (a setup error seen once in 1,481 tests).
    class Foreign(tf.Module):
        def __init__(self):
            super().__init__()
            self.scale = tf.Variable(2.0)

        @tf.function(
            input_signature=[tf.TensorSpec([None, 3], tf.float32), tf.TensorSpec([None], tf.int64)], autograph=False
        )
        def serve(self, x, offset):
            if pin_device:  # a Python-level branch: decided when the function is traced
                with tf.device(pin_device):
                    scaled = x * self.scale
            else:
                scaled = x * self.scale
            return {"scaled": scaled, "shifted": offset + 1, "total": tf.reduce_sum(x, axis=1)}

        @tf.function(input_signature=[tf.TensorSpec([], tf.int32)], autograph=False)
        def slow(self, steps):
            m = tf.random.stateless_uniform([384, 384], seed=[1, 2])
            out = tf.while_loop(lambda i, a: i < steps, lambda i, a: (i + 1, tf.tanh(a @ m)), [0, m])[1]
            return {"checksum": tf.reduce_sum(out)}

    module = Foreign()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve, "slow": module.slow})
    return path


def save_gated_model(path: Path) -> Path:
    """A SavedModel whose one signature holds a request until the test lets it go: it writes to the FIFO its
    `arrived` input names (blocking until the test reads it: the request is running), then to `release`
    (blocking until the test reads that one). Its answer echoes `arrived`. A server in another process cannot
    share a Python event with the test; two FIFOs can, so no step of the test waits for a clock."""
    import tensorflow as tf

    class Gated(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([], tf.string), tf.TensorSpec([], tf.string)], autograph=False)
        def serve(self, arrived, release):
            # The second write is made inside the first's dependencies: it opens `release` only after `arrived`.
            first = tf.io.write_file(arrived, "arrived")
            with tf.control_dependencies([first]):
                second = tf.io.write_file(release, "released")
            with tf.control_dependencies([second]):
                return {"arrived": tf.identity(arrived)}

    module = Gated()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return path


class Gate:
    """The test's side of save_gated_model: two FIFOs in `directory`, named in the request by `inputs`."""

    def __init__(self, directory: Path):
        self.arrived, self.release = directory / "arrived", directory / "release"
        os.mkfifo(self.arrived)
        os.mkfifo(self.release)
        self.inputs = {"arrived": np.array(str(self.arrived)), "release": np.array(str(self.release))}

    def wait_arrived(self) -> None:
        """Returns once the model runs the request (it opened `arrived` to write)."""
        self._read(self.arrived, "the request to reach the model")

    def open(self) -> None:
        """Lets the held request finish."""
        self._read(self.release, "the model to write its release FIFO")

    @staticmethod
    def _read(fifo: Path, what: str) -> None:
        import threading

        # Opening a FIFO blocks until its writer opens it; a thread keeps a broken run from hanging the test.
        reader = threading.Thread(target=fifo.read_bytes, daemon=True)
        reader.start()
        reader.join(60)  # generous: only a broken run takes more than milliseconds here
        assert not reader.is_alive(), f"timed out waiting for {what}"


@pytest.fixture(scope="session")
def two_trainings(trained_digits, tmp_path_factory):
    """The session's digits model (seed 0, version 1) and a second training with --seed 3 and --split-salt
    another (version 2: another held-out split, so each holds rows the other trained on) into the same
    --data-dir, both served (`all {}`); yields the server, the root and the SHA-256 of version 1's split
    before the second training. Read-only: a test that changes its files copies them first."""
    import hashlib
    import shutil

    from serving_fixtures import serve_every_version
    from trainserve.training.config import TrainConfig
    from trainserve.training.run import train

    root = tmp_path_factory.mktemp("splits")
    shutil.copytree(trained_digits / "data", root / "data")
    install_version(trained_digits / "models" / "digits" / "1", root / "models" / "digits", 1)
    first_split = json.loads((root / "data" / "digits" / "versions" / "1.json").read_text())["test_split"]
    before = hashlib.sha256((root / "data" / "digits" / first_split["file"]).read_bytes()).hexdigest()
    result = train(
        TrainConfig(
            epochs=1,
            seed=3,
            split_salt="another",
            export_base=root / "models",
            data_dir=root / "data",
            logs_dir=root / "logs",
        )
    )
    assert result.version == 2
    server = serve_every_version(root / "models.config", "digits", root / "models" / "digits", (1, 2))
    yield server, root, before
    assert server.stop() == 0


def install_version(template: Path, model_base: Path, version: int) -> Path:
    """Place a SavedModel as `model_base/<version>` atomically (staged copy, one rename)."""
    import shutil

    model_base.mkdir(parents=True, exist_ok=True)
    staged = model_base / f".tmp-install-{version}"
    shutil.copytree(template, staged)
    target = model_base / str(version)
    os.rename(staged, target)
    return target


# --- Docker (the e2e tier) --------------------------------------------------------------------------------------

TF_VERSION_ENV = pinned_tf_version()
# Our Dockerfiles on the local STAND-IN bases (no registry here): TensorFlow CPU for tensorflow/tensorflow:<v>-gpu,
# serve-local as tensorflow_model_server. Users get the real base images.
DOCKER_IMAGES = {
    "train-gpu": ("images/train-gpu/Dockerfile", f"trainserve-standin/tensorflow:{TF_VERSION_ENV}-gpu"),
    "serve-cpu": ("images/serve-cpu/Dockerfile", f"trainserve-standin/serving:{TF_VERSION_ENV}"),
    "eval": ("images/eval/Dockerfile", "trainserve-standin/python:3.11-slim"),
}


@pytest.fixture(scope="session")
def docker_client():
    import docker

    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:  # no socket, no permission, daemon down
        require("a Docker engine", False, f"{type(exc).__name__}: {exc}")
    return client


@pytest.fixture(scope="session")
def docker_images(docker_client, tmp_path_factory, worker_id) -> dict[str, str]:
    """Stand-in bases (reused when their content is unchanged) and our three images on them, built once per
    session (the e2e files share one xdist worker, and a lock keeps any other from building them again beside
    it); returns each image's tag."""
    tags = {name: f"trainserve/{name}:{TF_VERSION_ENV}" for name in DOCKER_IMAGES}
    once_per_session(tmp_path_factory, worker_id, "docker-images", lambda _root: build_images(tags))
    return tags


def build_images(tags: dict[str, str]) -> None:
    """The eval image needs only the Python stand-in, so it builds while build.sh copies TensorFlow into the
    other stand-ins; then train-gpu and serve-cpu build side by side. The builds wait on the network and the
    engine more than on the CPU."""
    from concurrent.futures import ThreadPoolExecutor

    standins = [REPO / "scripts" / "standins" / "build.sh"]
    env = {**os.environ, "TF_VERSION": TF_VERSION_ENV}
    subprocess.run([*standins, "base"], env=env, check=True)
    with ThreadPoolExecutor(len(DOCKER_IMAGES)) as pool:
        builds = [pool.submit(build_image, "eval", tags["eval"])]
        subprocess.run(standins, env=env, check=True)
        builds += [pool.submit(build_image, name, tags[name]) for name in ("train-gpu", "serve-cpu")]
        for build in builds:
            build.result()


def build_image(name: str, tag: str) -> None:
    """One of DOCKER_IMAGES on its stand-in base, through a client of its own (one per thread); its time is
    appended to $STANDINS_TIMES where set, beside the stand-ins' (.ci/run prints them)."""
    import docker

    started = time.monotonic()
    dockerfile, base_image = DOCKER_IMAGES[name]
    client = docker.from_env()
    try:
        client.images.build(
            path=str(REPO / Path(dockerfile).parent if name == "serve-cpu" else REPO),
            dockerfile=str(REPO / dockerfile),
            tag=tag,
            buildargs={"BASE_IMAGE": base_image, "TF_VERSION": TF_VERSION_ENV},
            network_mode="host",
            rm=True,
        )
    finally:
        client.close()
    if os.environ.get("STANDINS_TIMES"):
        with open(os.environ["STANDINS_TIMES"], "a") as times:
            times.write(f"images: {tag} in {time.monotonic() - started:.0f} s\n")
