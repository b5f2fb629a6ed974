"""The default model follows the data: a CSV and an [N, F] array train with no --architecture (the MLP),
uint8 images get the CNN; the choice is recorded in the published version."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from trainserve.training.config import TrainConfig


def _train_without_architecture(tmp_path, data: str, **options):
    from trainserve.training.run import train

    config = TrainConfig(
        data=data,
        model_name="m",
        export_base=tmp_path / "models",
        data_dir=tmp_path / "data",
        logs_dir=tmp_path / "logs",
        epochs=1,
        batch_size=16,
        **options,
    )
    assert config.architecture == "auto"
    result = train(config)
    assert result.version == 1
    return json.loads((result.version_dir / "assets.extra" / "trainserve.json").read_text())


@pytest.mark.integration
def test_a_csv_trains_with_no_architecture_on_the_mlp(tmp_path, caplog):
    rng = np.random.default_rng(0)
    rows = ["size,colour,label"] + [f"{x:.3f},{'red' if x > 0 else 'blue'},{int(x > 0)}" for x in rng.normal(size=80)]
    (tmp_path / "t.csv").write_text("\n".join(rows) + "\n")
    with caplog.at_level(logging.INFO, logger="trainserve"):
        metadata = _train_without_architecture(tmp_path, str(tmp_path / "t.csv"), label_column="label")
    assert metadata["model_fn"] == "mlp"
    assert "architecture mlp, chosen for the data" in caplog.text


@pytest.mark.integration
@pytest.mark.parametrize(
    "x_dtype, y, expected",
    [
        pytest.param(np.float32, lambda x: (x[:, 0] > 0).astype(np.int64), "mlp", id="features-classification"),
        pytest.param(np.float64, lambda x: x[:, :2].astype(np.float32), "mlp", id="features-regression"),
    ],
)
def test_an_n_by_f_array_trains_with_no_architecture_on_the_mlp(tmp_path, x_dtype, y, expected):
    x = np.random.default_rng(1).normal(size=(100, 6)).astype(x_dtype)
    np.savez(tmp_path / "f.npz", x_train=x[:80], y_train=y(x[:80]), x_test=x[80:], y_test=y(x[80:]))
    metadata = _train_without_architecture(tmp_path, str(tmp_path / "f.npz"))
    assert metadata["model_fn"] == expected
    assert metadata["signature"]["inputs"] == ["x"]


@pytest.mark.unit
def test_uint8_images_get_the_cnn_and_other_arrays_the_mlp():
    from trainserve.task import Task
    from trainserve.training.builtin_models import default_architecture
    from trainserve.training.model_fn import DataSpec, InputSpec

    task = Task("classification", classes=3)
    spec = lambda shape, dtype: DataSpec((InputSpec("images", shape, dtype),), task)  # noqa: E731
    assert default_architecture(spec((8, 8, 1), "uint8")) == "cnn"
    assert default_architecture(spec((8, 8, 1), "float32")) == "mlp"
    assert default_architecture(spec((6,), "float32")) == "mlp"
