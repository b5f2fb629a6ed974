"""Gated rollout end to end: real serve-local subprocesses polling the config that `trainserve candidate`,
`promote` and `rollback` (real CLI subprocesses) rewrite, real `trainserve eval` over gRPC, and clients
asking for `stable` all the way through."""

from __future__ import annotations

import json
import threading
import time

import grpc
import numpy as np
import pytest

from conftest import ServeLocal, assert_one_line_error, install_version, record_version, run_cli, target_flags
from trainserve.rollout.config_file import history_path, new_config, write_config
from trainserve.rollout.history import read_history

pytestmark = pytest.mark.integration
IMAGES = np.random.default_rng(7).integers(0, 256, (4, 8, 8, 1), dtype=np.uint8)
# Every version's held-out split (random-weight models: what is checked here is the rollout, not accuracy).
SPLIT = {"images": np.random.default_rng(8).integers(0, 256, (64, 8, 8, 1), dtype=np.uint8)}, np.arange(64) % 10
SERVER_FLAGS = ("--model_config_file_poll_wait_seconds=1", "--allow_version_labels_for_unavailable_models")


def start_server(serve_local, config) -> ServeLocal:
    server = serve_local(f"--model_config_file={config}", *SERVER_FLAGS)  # the fixture stops it, pass or fail
    server.wait_for(lambda: server.versions("m"), "the server to answer")
    return server


def label_version(server: ServeLocal, label: str) -> int | None:
    code, body = server.get(f"/v1/models/m/labels/{label}/metadata")  # the status route ignores labels, as TF Serving
    return int(body["model_spec"]["version"]) if code == 200 else None


class StableClients:
    """Threads sending Predict for label `stable` in a loop. Each answer is kept with its thread and the time
    its request was sent: the order in which threads finish appending says nothing about the server."""

    def __init__(self, server: ServeLocal, threads: int = 3):
        from trainserve.protos import predict_pb2, prediction_service_pb2_grpc
        from trainserve.tensors import to_tensor_proto

        self.request = predict_pb2.PredictRequest()
        self.request.model_spec.name, self.request.model_spec.version_label = "m", "stable"
        to_tensor_proto(IMAGES, into=self.request.inputs["images"])
        self.stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(server.target))
        self.answers: list[tuple[int, float, int]] = []  # (thread, monotonic send time, version answered)
        self.failures: list[str] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(threads)]
        for thread in self.threads:
            thread.start()

    def _loop(self, thread: int) -> None:
        while not self.stop.is_set():
            sent = time.monotonic()
            try:
                version = self.stub.Predict(self.request, timeout=30).model_spec.version.value
                self.answers.append((thread, sent, version))
            except grpc.RpcError as exc:
                self.failures.append(f"{exc.code().name}: {exc.details()}")

    def latest(self, n: int) -> list[int]:
        """The versions that answered the last `n` requests sent."""
        return [version for _, _, version in sorted(self.answers, key=lambda a: a[1])[-n:]]

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)

    def assert_switched_once(self, old: int, new: int, move_began: float, move_done: float) -> None:
        """Sent before the label began to move: `old`; sent after the move was confirmed: `new`; in between
        either. Each thread, whose requests follow one another, sees `old` then only `new`."""
        for thread, sent, version in self.answers:
            if sent < move_began:
                assert version == old, f"thread {thread}: a request sent before the move answered by v{version}"
            elif sent > move_done:
                assert version == new, f"thread {thread}: a request sent after the move answered by v{version}"
            else:
                assert version in (old, new), f"thread {thread}: v{version} answered during the move"
        for thread in range(len(self.threads)):
            mine = [version for t, _, version in sorted(self.answers, key=lambda a: a[1]) if t == thread]
            switch = mine.index(new) if new in mine else len(mine)
            assert set(mine[:switch]) <= {old} and set(mine[switch:]) <= {new}, f"thread {thread}: {mine}"


def cli_ok(*args):
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def publish(template, base, version: int):
    """A version as training publishes it: its files, and its split and record on the data volume."""
    data_dir = base.parent.parent / "data"
    return record_version(install_version(template, base, version), data_dir, "m", *SPLIT, {"source": "s.npz"})


def evaluate(server: ServeLocal, report, min_accuracy: float, config) -> int:
    """The promote Job's eval: the candidate on its own split, against stable where the config labels one."""
    # Untrained versions: the rollout's mechanics are on trial, so the bound-based gate allows any drop.
    compared = (
        "--compare-with",
        "stable",
        "--allow-no-baseline",
        "--rollout-config",
        config,
        "--max-drop",
        "accuracy=1",
    )
    data = ("--data-dir", config.parent.parent / "data")
    gated = (*data, *compared, "--min-accuracy", min_accuracy, "--report", report, "--wait", "60")
    proc = run_cli("eval", *target_flags(server, label="candidate"), *gated)
    assert report.is_file(), proc.stdout + proc.stderr
    return proc.returncode


def test_gated_rollout_with_serve_local(model_versions, serve_local, tmp_path):
    base, config = tmp_path / "models" / "m", tmp_path / "rollout" / "models.config"
    publish(model_versions[0], base, 1)
    write_config(config, new_config("m", str(base)))  # what the serving image writes before any rollout
    server = start_server(serve_local, config)
    rollout = ("--config", config)

    # First run: v1 becomes the candidate, passes, and is the first stable version.
    cli_ok("candidate", *rollout, "--server", server.target, "--wait", "120")
    assert evaluate(server, tmp_path / "r1.json", 0.0, config) == 0
    cli_ok("promote", *rollout, "--report", tmp_path / "r1.json", "--server", server.target)
    assert label_version(server, "stable") == 1

    # v2 cannot meet its threshold: promote refuses, stable still answers v1, the config is untouched.
    publish(model_versions[1], base, 2)
    cli_ok("candidate", *rollout, "--server", server.target, "--wait", "120")
    assert label_version(server, "candidate") == 2 and label_version(server, "stable") == 1
    assert evaluate(server, tmp_path / "r2.json", 1.0, config) == 1
    assert json.loads((tmp_path / "r2.json").read_text())["version"] == 2
    before = config.read_bytes()
    refused = run_cli("promote", *rollout, "--report", tmp_path / "r2.json")
    assert refused.returncode == 2 and "did not pass" in refused.stderr, refused.stderr
    assert config.read_bytes() == before and label_version(server, "stable") == 1

    # v3 passes and is promoted while clients ask for `stable`: no failed request, v1 then v3 only.
    publish(model_versions[2], base, 3)
    clients = StableClients(server)
    try:
        cli_ok("candidate", *rollout, "--server", server.target, "--wait", "120")
        assert evaluate(server, tmp_path / "r3.json", 0.0, config) == 0
        move_began = time.monotonic()
        cli_ok("promote", *rollout, "--report", tmp_path / "r3.json", "--server", server.target)
        move_done = time.monotonic()  # promote returns once the server answers `stable` with v3
        server.wait_for(lambda: clients.latest(20).count(3) == 20, "clients on version 3")
    finally:
        clients.finish()
    assert not clients.failures, clients.failures[:3]
    assert any(sent < move_began for _, sent, _ in clients.answers), "clients were asking before the move"
    clients.assert_switched_once(old=1, new=3, move_began=move_began, move_done=move_done)
    server.wait_for(lambda: server.versions("m").get(2) == "END", "the failed candidate unloaded")
    assert {v for v, s in server.versions("m").items() if s == "AVAILABLE"} == {1, 3}, "previous stays loaded"

    # Rollback: stable is v1 again at once (it stayed loaded); v3 unloads.
    cli_ok("rollback", *rollout, "--reason", "test", "--server", server.target)
    assert label_version(server, "stable") == 1
    server.wait_for(lambda: server.versions("m").get(3) == "END", "the rolled-back version unloaded")

    # v3 staged again, then the server restarts: the same versions and labels come back.
    cli_ok("candidate", *rollout, "--server", server.target, "--wait", "120")
    assert server.stop() == 0
    restarted = start_server(serve_local, config)
    restarted.wait_available("m", 3)
    assert {v for v, s in restarted.versions("m").items() if s == "AVAILABLE"} == {1, 3}
    assert (label_version(restarted, "stable"), label_version(restarted, "candidate")) == (1, 3)
    assert restarted.stop() == 0
    actions = [(e["action"], e["after"]) for e in read_history(history_path(config))]
    assert actions == [
        ("candidate", {"candidate": 1}),
        ("promote", {"stable": 1}),
        ("candidate", {"stable": 1, "candidate": 2}),
        ("candidate", {"stable": 1, "candidate": 3}),
        ("promote", {"stable": 3, "previous": 1}),
        ("rollback", {"stable": 1}),
        ("candidate", {"stable": 1, "candidate": 3}),
    ]


def test_candidate_that_fails_to_load_is_a_one_line_error_and_changes_nothing(model_versions, serve_local, tmp_path):
    base, config = tmp_path / "models" / "m", tmp_path / "rollout" / "models.config"
    install_version(model_versions[0], base, 1)
    write_config(config, new_config("m", str(base)))
    server = start_server(serve_local, config)
    server.wait_available("m", 1)
    broken = install_version(model_versions[1], base, 2)  # published, but not a SavedModel
    (broken / "saved_model.pb").write_bytes(b"\x0a\x03not a saved model")
    before = config.read_bytes()
    proc = run_cli("candidate", "--config", config, "--version", "2", "--server", server.target, "--wait", "120")
    assert_one_line_error(proc, "model m version 2 failed to load")
    assert config.read_bytes() == before and not history_path(config).exists()
    assert server.versions("m")[1] == "AVAILABLE"
