"""`trainserve runs`: the same training on two set-ups, side by side, fingerprints checked."""

from __future__ import annotations

import json

import pytest

from conftest import assert_one_line_error, run_cli
from trainserve.cli import main


@pytest.fixture(scope="module")
def cpu_run(trained_digits):
    """One real training run on the CPU: its logs directory."""
    return trained_digits / "logs"


def runs(capsys, *paths) -> tuple[int, str, str]:
    """`trainserve runs PATHS` in this process: exit code, stdout, stderr."""
    code = main(["runs", *map(str, paths)])
    out, err = capsys.readouterr()
    return code, out, err


def _as_gpu_run(cpu_run, path, fingerprint=None):
    """The CPU run's summary relabelled as a 2-GPU mixed-precision run (no GPU on the test machine)."""
    summary = json.loads((cpu_run / "run_summary.json").read_text())
    summary["devices"].update(strategy="mirrored", replicas=2, gpus=[{"name": "/gpu:0", "device_name": "H100"}] * 2)
    summary.update(precision="mixed_float16", train_examples_per_s=123456.0)
    if fingerprint:
        summary["data"]["fingerprint"] = fingerprint
    path.mkdir()
    (path / "run_summary.json").write_text(json.dumps(summary))
    return path, summary


@pytest.mark.unit
def test_table_shows_both_runs_and_their_metrics(cpu_run, tmp_path, capsys):
    gpu, summary = _as_gpu_run(cpu_run, tmp_path / "gpu")
    code, out, err = runs(capsys, cpu_run, gpu)
    assert code == 0, err
    header, cpu_line, gpu_line = out.strip().splitlines()
    assert header.split()[:3] == ["run", "device", "strategy"] and "test_accuracy" in header
    assert cpu_line.split()[1:3] == ["CPU", "default"]
    assert "H100 x2" in gpu_line and "mirrored" in gpu_line and "mixed_float16" in gpu_line and "123,456" in gpu_line
    assert f"{summary['metrics']['test_accuracy']:.4f}" in cpu_line
    assert "different data" not in err


@pytest.mark.unit
def test_different_data_is_warned(cpu_run, tmp_path, capsys):
    gpu, _ = _as_gpu_run(cpu_run, tmp_path / "gpu", fingerprint="f" * 64)
    code, _, err = runs(capsys, cpu_run, gpu)
    assert code == 0
    assert "different data" in err and "ffffffffffff" in err


@pytest.mark.integration
def test_not_a_run_is_a_one_line_error(tmp_path):
    assert_one_line_error(run_cli("runs", tmp_path), "run_summary.json not found")
    (tmp_path / "run_summary.json").write_text("{}")
    assert_one_line_error(run_cli("runs", tmp_path / "run_summary.json"), "not a trainserve run summary")
