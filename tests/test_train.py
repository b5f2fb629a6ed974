"""`trainserve train` for real: TensorFlow on the CPU, tiny configs, published versions checked afresh."""

from __future__ import annotations

import csv
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import run_cli
from trainserve.layout import numeric_versions

pytestmark = pytest.mark.integration

FRESH_ACCURACY = """
import sys, numpy as np
from trainserve.savedmodel import LoadedModel
with np.load(sys.argv[1]) as npz:
    for version_dir in sys.argv[2:]:
        out = LoadedModel(version_dir).run("serving_default", {"images": npz["x_test"]})
        print(float(np.mean(out["classes"] == npz["y_test"])))
"""


def train(tmp: Path, *args: str, name: str = "digits", env: dict | None = None):
    proc = run_cli(
        "train",
        "--model-name",
        name,
        "--export-base",
        tmp / "models",
        "--data-dir",
        tmp / "data",
        "--logs-dir",
        tmp / "logs",
        *args,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def summary(tmp: Path) -> dict:
    return json.loads((tmp / "logs" / "run_summary.json").read_text())


def has_half_precision(version_dir: Path) -> bool:
    from tensorflow.core.framework import types_pb2

    from trainserve.savedmodel import serve_meta_graph

    graph = serve_meta_graph(version_dir).graph_def
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    return any(
        attr.type == types_pb2.DT_HALF or types_pb2.DT_HALF in attr.list.type
        for node in nodes
        for attr in node.attr.values()
    )


def test_digits_publishes_v1_then_v2_and_each_scores_in_a_fresh_process(trained_digits, tmp_path):
    shutil.copytree(trained_digits, tmp_path, dirs_exist_ok=True)  # v1: trained once for the session
    second = train(tmp_path, "--epochs", "5")
    assert "published digits version 2 at" in second.stdout
    assert "no GPU visible: training on the CPU" in second.stderr
    assert "CPU gate passed (export and gate in this process: no GPU here" in second.stderr
    base = tmp_path / "models" / "digits"
    assert numeric_versions(base) == [1, 2]
    fresh = subprocess.run(  # one process that never trained anything scores both versions
        [sys.executable, "-c", FRESH_ACCURACY, tmp_path / "data" / "digits" / "test.npz", base / "1", base / "2"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert [float(line) > 0.9 for line in fresh.stdout.split()] == [True, True], fresh.stdout
    for version in (1, 2):
        meta = json.loads((base / str(version) / "assets.extra" / "trainserve.json").read_text())
        assert meta["version"] == version and meta["tensorflow"] == "2.21.0"
        assert meta["input_shape"] == [8, 8, 1] and len(meta["label_names"]) == 10
        assert meta["data"]["fingerprint"] and meta["metrics"]["test_accuracy"] > 0.9
        assert (base / str(version) / "assets.extra" / "tf_serving_warmup_requests").stat().st_size > 0
    logs = tmp_path / "logs"
    with open(logs / "history.csv") as fh:
        assert [row["epoch"] for row in csv.DictReader(fh)] == [str(e) for e in range(5)]
    assert (logs / "training_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list((logs / "tensorboard" / "train").glob("events.out.tfevents.*"))
    run = summary(tmp_path)
    assert run["version"] == 2 and run["precision"] == "float32" and run["train_examples_per_s"] > 0
    assert run["devices"]["strategy"] == "default" and run["metrics"]["test_accuracy"] > 0.9


def test_mirrored_strategy_on_two_logical_cpus_with_grad_accumulation(tmp_path):
    proc = train(tmp_path, "--epochs", "1", "--cpu-replicas", "2", "--batch-size", "16", "--grad-accum", "2")
    run = summary(tmp_path)
    assert run["devices"]["strategy"] == "mirrored" and run["devices"]["replicas"] == 2
    assert len(run["devices"]["devices"]) == 2
    assert run["global_batch"] == 32, "global batch = per-replica batch x replicas"
    assert "gradients accumulated over 2 micro-batches" in proc.stderr
    assert "CPU gate passed" in proc.stderr


def test_mixed_precision_publishes_a_float32_graph(tmp_path):
    proc = train(tmp_path, "--epochs", "1", "--mixed-precision", "on")
    assert "precision: mixed_float16" in proc.stderr
    version_dir = tmp_path / "models" / "digits" / "1"
    meta = json.loads((version_dir / "assets.extra" / "trainserve.json").read_text())
    assert meta["trained_on"]["precision"] == "mixed_float16" and meta["exported_precision"] == "float32"
    assert meta["gate"]["atol"] == 0.01
    assert not has_half_precision(version_dir), "no float16 tensor anywhere in the served graph"


def test_killed_run_resumes_from_its_last_finished_epoch(tmp_path):
    args = [
        "--data",
        "synthetic",
        "--synthetic-size",
        "12000",
        "--model",
        "mlp",
        "--epochs",
        "3",
        "--backup-dir",
        str(tmp_path / "backup"),
    ]
    command = [
        sys.executable,
        "-m",
        "trainserve",
        "train",
        "--export-base",
        str(tmp_path / "models"),
        "--data-dir",
        str(tmp_path / "data"),
        "--logs-dir",
        str(tmp_path / "logs"),
        *args,
    ]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    history = tmp_path / "logs" / "history.csv"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if history.is_file() and len(history.read_text().splitlines()) >= 2:  # header + epoch 1
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "killed after epoch 1, before the run ended"
    assert numeric_versions(tmp_path / "models" / "digits") == []

    rerun = train(tmp_path, *args)
    assert "resuming from epoch 2 of 3" in rerun.stderr
    with open(history) as fh:
        assert [row["epoch"] for row in csv.DictReader(fh)] == ["0", "1", "2"]
    assert summary(tmp_path)["resumed_from_epoch"] == 2
    assert numeric_versions(tmp_path / "models" / "digits") == [1]
