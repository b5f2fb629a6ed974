"""The CPU gate on real SavedModels: ours, foreign ones, GPU-pinned ones, broken ones."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from conftest import save_foreign_model
from trainserve.savedmodel import LoadedModel, gpu_pinned_nodes
from trainserve.training.gate import GoldenBatch, check_on_cpu, run_gate


@pytest.mark.integration
def test_trainserve_export_passes_with_its_golden_batch(tiny_savedmodel, tmp_path):
    model = LoadedModel(tiny_savedmodel)
    images = np.random.default_rng(1).integers(0, 256, (5, 8, 8, 1), dtype=np.uint8)
    expected = model.run("serving_default", {"images": images})
    golden = GoldenBatch({"images": images}, expected)
    result = run_gate(tiny_savedmodel, golden)
    assert result.ok, result.reason
    assert result.max_abs_diff <= 1e-6
    assert result.signatures == ["serving_default"]


@pytest.mark.unit
def test_golden_mismatch_fails_with_the_difference(tiny_savedmodel, tmp_path):
    images = np.zeros((2, 8, 8, 1), np.uint8)
    outputs = LoadedModel(tiny_savedmodel).run("serving_default", {"images": images})
    outputs["probabilities"] = outputs["probabilities"] + 0.05
    result = check_on_cpu(tiny_savedmodel, GoldenBatch({"images": images}, outputs))
    assert not result.ok
    assert "output 'probabilities' differs by 0.05" in result.reason and "expected <= 0.0001" in result.reason


@pytest.mark.unit
def test_changed_classes_fail_even_within_tolerance(tiny_savedmodel, tmp_path):
    images = np.zeros((2, 8, 8, 1), np.uint8)
    outputs = LoadedModel(tiny_savedmodel).run("serving_default", {"images": images})
    outputs["classes"] = (outputs["classes"] + 1) % 10
    result = check_on_cpu(tiny_savedmodel, GoldenBatch({"images": images}, outputs), atol=1.0)
    assert not result.ok and "classes" in result.reason and "expected identical" in result.reason


@pytest.mark.unit
def test_foreign_savedmodel_runs_on_zero_inputs(tmp_path):
    path = save_foreign_model(tmp_path / "foreign")
    result = check_on_cpu(path)
    assert result.ok, result.reason
    assert "zeros" in result.checked


@pytest.mark.integration
def test_gpu_pinned_nodes_are_found_in_function_bodies(tmp_path):
    path = save_foreign_model(tmp_path / "pinned", pin_device="/device:GPU:0")
    pinned = gpu_pinned_nodes(path)
    assert pinned and all("GPU:0" in p for p in pinned)
    result = run_gate(path)
    assert not result.ok
    assert "pinned to a GPU" in result.reason


@pytest.mark.unit
def test_corrupt_saved_model_pb_is_reported(tiny_savedmodel, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_savedmodel, broken)
    (broken / "saved_model.pb").write_bytes(b"\x08\x01garbage" * 10)
    result = check_on_cpu(broken)
    assert not result.ok and "corrupt" in result.reason


@pytest.mark.unit
def test_missing_variables_fail_the_load(tiny_savedmodel, tmp_path):
    half = tmp_path / "half"
    shutil.copytree(tiny_savedmodel, half)
    shutil.rmtree(half / "variables")
    result = check_on_cpu(half)
    assert not result.ok and "does not load on CPU" in result.reason


@pytest.mark.unit
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


# No GPU: this process; GPUs: one child that sees none (a fresh TensorFlow, so the integration tier).
BOTH_WAYS = [
    pytest.param(True, id="in-process", marks=pytest.mark.unit),
    pytest.param(False, id="child-process", marks=pytest.mark.integration),
]


@pytest.fixture(scope="module")
def export_job():
    """A trained-looking CNN's export job: its function, data spec, weights and golden batch."""
    import keras

    from trainserve.task import Task
    from trainserve.training.export import ExportJob, serving_outputs
    from trainserve.training.model import build_for_training
    from trainserve.training.model_fn import data_spec, input_structure

    images = np.random.default_rng(2).integers(0, 256, (16, 8, 8, 1), dtype=np.uint8)
    spec = data_spec({"images": images}, Task("classification", classes=10))
    keras.utils.set_random_seed(3)
    model = build_for_training("cnn", spec, 1e-3)
    answers = serving_outputs(model(input_structure(model)({"images": images[:4]})), spec.task)
    outputs = {k: np.asarray(v) for k, v in answers.items()}
    return ExportJob("cnn", spec, model.get_weights(), GoldenBatch({"images": images[:4]}, outputs), 1e-4)


@pytest.mark.parametrize("in_process", BOTH_WAYS)
def test_export_and_gate_pass_and_reproduce_the_trained_outputs(export_job, tmp_path, in_process):
    from trainserve.training.export import export_and_gate

    result = export_and_gate(export_job, tmp_path / "v", in_process=in_process)
    assert result.ok, result.reason
    assert result.checked == "golden batch of 4" and result.max_abs_diff <= 1e-4
    got = LoadedModel(tmp_path / "v").run("serving_default", export_job.golden.inputs)
    np.testing.assert_allclose(got["probabilities"], export_job.golden.outputs["probabilities"], atol=1e-5)


@pytest.mark.parametrize("in_process", BOTH_WAYS)
def test_export_and_gate_refuse_outputs_training_did_not_compute(export_job, tmp_path, in_process):
    from dataclasses import replace

    from trainserve.training.export import export_and_gate

    outputs = {**export_job.golden.outputs, "probabilities": export_job.golden.outputs["probabilities"] + 0.01}
    job = replace(export_job, golden=GoldenBatch(export_job.golden.inputs, outputs))
    result = export_and_gate(job, tmp_path / "v", in_process=in_process)
    assert not result.ok and "output 'probabilities' differs by 0.01" in result.reason, result.reason


@pytest.mark.unit
def test_a_golden_batch_keeps_every_byte_of_its_strings(tmp_path):
    """Image files and text travel to the gate's child process exactly: numpy's fixed-width bytes would drop a
    value's trailing NUL bytes (a BMP's row padding), and the gate would feed the export other bytes."""
    files = np.array([b"BM\x00\x01\x00\x00", b"", b"\x89PNG\x00"], dtype=object)
    text = np.array([["a", "\u00e9"], ["", "z\x00"]], dtype=object)  # (a numpy str array drops NULs itself)
    saved = GoldenBatch({"image_bytes": files, "kind": text, "x": np.arange(3.0)}, {"class_names": files[:2]})
    loaded = GoldenBatch.load(saved.save(tmp_path / "golden.npz"))
    assert sorted(loaded.inputs) == ["image_bytes", "kind", "x"] and sorted(loaded.outputs) == ["class_names"]
    assert list(loaded.inputs["image_bytes"]) == list(files)
    assert loaded.inputs["kind"].shape == (2, 2) and loaded.inputs["kind"][1, 1] == b"z\x00"
    np.testing.assert_array_equal(loaded.inputs["x"], np.arange(3.0))
    assert list(loaded.outputs["class_names"]) == list(files[:2])
