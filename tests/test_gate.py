"""The CPU gate on real SavedModels: ours, foreign ones, GPU-pinned ones, broken ones."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from conftest import save_foreign_model
from trainserve.savedmodel import LoadedModel, gpu_pinned_nodes
from trainserve.training.gate import check_on_cpu, run_gate, save_golden


def test_trainserve_export_passes_with_its_golden_batch(tiny_savedmodel, tmp_path):
    model = LoadedModel(tiny_savedmodel)
    images = np.random.default_rng(1).integers(0, 256, (5, 8, 8, 1), dtype=np.uint8)
    expected = model.run("serving_default", {"images": images})
    golden = save_golden(tmp_path / "g.npz", {"images": images}, expected)
    result = run_gate(tiny_savedmodel, golden)
    assert result.ok, result.reason
    assert result.max_abs_diff <= 1e-6
    assert result.signatures == ["serving_default"]


def test_golden_mismatch_fails_with_the_difference(tiny_savedmodel, tmp_path):
    images = np.zeros((2, 8, 8, 1), np.uint8)
    outputs = LoadedModel(tiny_savedmodel).run("serving_default", {"images": images})
    outputs["probabilities"] = outputs["probabilities"] + 0.05
    result = check_on_cpu(tiny_savedmodel, save_golden(tmp_path / "g.npz", {"images": images}, outputs))
    assert not result.ok
    assert "output 'probabilities' differs by 0.05" in result.reason and "expected <= 0.0001" in result.reason


def test_changed_classes_fail_even_within_tolerance(tiny_savedmodel, tmp_path):
    images = np.zeros((2, 8, 8, 1), np.uint8)
    outputs = LoadedModel(tiny_savedmodel).run("serving_default", {"images": images})
    outputs["classes"] = (outputs["classes"] + 1) % 10
    result = check_on_cpu(tiny_savedmodel, save_golden(tmp_path / "g.npz", {"images": images}, outputs), atol=1.0)
    assert not result.ok and "classes" in result.reason and "expected identical" in result.reason


def test_foreign_savedmodel_runs_on_zero_inputs(tmp_path):
    path = save_foreign_model(tmp_path / "foreign")
    result = check_on_cpu(path)
    assert result.ok, result.reason
    assert "zeros" in result.checked


def test_gpu_pinned_nodes_are_found_in_function_bodies(tmp_path):
    path = save_foreign_model(tmp_path / "pinned", pin_device="/device:GPU:0")
    pinned = gpu_pinned_nodes(path)
    assert pinned and all("GPU:0" in p for p in pinned)
    result = run_gate(path)
    assert not result.ok
    assert "pinned to a GPU" in result.reason


def test_corrupt_saved_model_pb_is_reported(tiny_savedmodel, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_savedmodel, broken)
    (broken / "saved_model.pb").write_bytes(b"\x08\x01garbage" * 10)
    result = check_on_cpu(broken)
    assert not result.ok and "corrupt" in result.reason


def test_missing_variables_fail_the_load(tiny_savedmodel, tmp_path):
    half = tmp_path / "half"
    shutil.copytree(tiny_savedmodel, half)
    shutil.rmtree(half / "variables")
    result = check_on_cpu(half)
    assert not result.ok and "does not load on CPU" in result.reason


@pytest.mark.parametrize(
    "inputs, message",
    [
        pytest.param({"images": np.zeros((1, 8, 8, 1), np.float32)}, "is float32: expected uint8", id="dtype"),
        pytest.param({"images": np.zeros((1, 9, 8, 1), np.uint8)}, "expected uint8 [None, 8, 8, 1]", id="shape"),
        pytest.param({"pixels": np.zeros((1, 8, 8, 1), np.uint8)}, "unknown ['pixels']", id="name"),
    ],
)
def test_inputs_are_checked_like_tf_serving(tiny_savedmodel, inputs, message):
    from trainserve.errors import TrainserveError

    with pytest.raises(TrainserveError) as err:
        LoadedModel(tiny_savedmodel).run("serving_default", inputs)
    assert message in str(err.value)
