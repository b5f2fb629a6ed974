"""Multi-worker training for real: two worker processes on localhost under TF_CONFIG, and the
TF_CONFIG builder the Kubernetes Indexed Job uses."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import free_port
from trainserve.errors import TrainserveError
from trainserve.layout import numeric_versions
from trainserve.training.cluster import parse_tf_config, tf_config_from_env

INDEXED = {
    "JOB_COMPLETION_INDEX": "1",
    "TRAINSERVE_WORKERS": "3",
    "TRAINSERVE_JOB_NAME": "train-mw",
    "TRAINSERVE_SERVICE": "train-mw-workers",
}


def test_tf_config_from_an_indexed_job_pod():
    config = tf_config_from_env(INDEXED)
    assert config == {
        "cluster": {"worker": [f"train-mw-{i}.train-mw-workers:2222" for i in range(3)]},
        "task": {"type": "worker", "index": 1},
    }
    namespaced = tf_config_from_env({**INDEXED, "TRAINSERVE_NAMESPACE": "ml", "TRAINSERVE_WORKER_PORT": "3000"})
    assert namespaced["cluster"]["worker"][0] == "train-mw-0.train-mw-workers.ml.svc:3000"
    assert parse_tf_config(json.dumps(config)) == (config["cluster"]["worker"], "worker", 1)


@pytest.mark.parametrize(
    "change, message",
    [
        pytest.param({"JOB_COMPLETION_INDEX": ""}, "JOB_COMPLETION_INDEX not set", id="no-index"),
        pytest.param({"JOB_COMPLETION_INDEX": "3"}, "expected < TRAINSERVE_WORKERS (3)", id="index-too-big"),
        pytest.param({"TRAINSERVE_WORKERS": "two"}, "TRAINSERVE_WORKERS='two': expected an integer", id="bad-count"),
        pytest.param({"TRAINSERVE_WORKER_PORT": "70000"}, "expected a port number", id="bad-port"),
        pytest.param({"TRAINSERVE_SERVICE": ""}, "TRAINSERVE_SERVICE not set", id="no-service"),
    ],
)
def test_tf_config_bad_environment(change, message):
    with pytest.raises(TrainserveError) as err:
        tf_config_from_env({**INDEXED, **change})
    assert message in str(err.value)


@pytest.mark.parametrize(
    "raw", ["not json", '{"cluster": {}}', '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 4}}']
)
def test_malformed_tf_config_is_a_clear_error(raw):
    with pytest.raises(TrainserveError, match="TF_CONFIG"):
        parse_tf_config(raw)


def test_tf_config_command_prints_json(monkeypatch, capsys):
    from trainserve.cli import main

    for key, value in INDEXED.items():
        monkeypatch.setenv(key, value)
    assert main(["tf-config"]) == 0
    assert json.loads(capsys.readouterr().out)["task"]["index"] == 1


@pytest.mark.slow
def test_two_workers_train_one_model_and_only_worker_zero_publishes(tmp_path):
    workers = [f"localhost:{free_port()}" for _ in range(2)]
    procs = []
    for index in range(2):
        env = {
            **os.environ,
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "TF_CONFIG": json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}),
        }
        log = open(tmp_path / f"worker-{index}.log", "w")  # noqa: SIM115
        procs.append((subprocess.Popen(
            [sys.executable, "-m", "trainserve", "train", "--epochs", "4", "--batch-size", "32",
             "--export-base", str(tmp_path / "models"), "--data-dir", str(tmp_path / "data"),
             "--logs-dir", str(tmp_path / "logs")],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        ), log))  # fmt: skip
    for proc, log in procs:
        proc.wait(timeout=300)
        log.close()
    logs = [(tmp_path / f"worker-{i}.log").read_text() for i in range(2)]
    assert [p.returncode for p, _ in procs] == [0, 0], logs[0][-3000:] + logs[1][-3000:]

    chief = json.loads((tmp_path / "logs" / "run_summary.json").read_text())
    other = json.loads((tmp_path / "logs" / "worker-1" / "run_summary.json").read_text())
    for summary, index in ((chief, 0), (other, 1)):
        assert summary["devices"]["strategy"] == "multi-worker"
        assert summary["devices"]["workers"] == 2 and summary["devices"]["worker_index"] == index
        assert summary["devices"]["replicas"] == 2 and summary["global_batch"] == 64
    # Both took part: each processed half of every global batch (1437 training examples less the 10 %
    # validation split = 1293 -> 20 full batches of 64).
    steps = 1293 // 64
    assert chief["examples_seen_by_this_worker"] == other["examples_seen_by_this_worker"] == 4 * steps * 32
    assert chief["weights_sha256"] == other["weights_sha256"], "the workers end with identical weights"
    assert numeric_versions(tmp_path / "models" / "digits") == [1], "only worker 0 publishes"
    assert chief["version"] == 1 and other["version"] is None
    assert "CPU gate passed" in logs[0] and "CPU gate passed" not in logs[1]
    assert chief["metrics"]["test_accuracy"] > 0.5
