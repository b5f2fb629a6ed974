"""Transfer learning: a Keras Applications backbone loads the weights file it is given (no network here), and a
frozen-then-fine-tuned run on a small folder passes the CPU gate and publishes."""

from __future__ import annotations

import numpy as np
import pytest
from image_files import write_image_folder

from conftest import run_cli
from trainserve.errors import TrainserveError

ARCH = "mobilenet_v3_small"


def _spec(size: int = 32):
    from trainserve.data import ImageFormat
    from trainserve.task import Task
    from trainserve.training.model_fn import data_spec

    task = Task("classification", classes=3, label_names=("a", "b", "c"))
    return data_spec({}, task, image=ImageFormat(size, size, 3))


def _weights_file(path, seed: int = 7):
    """A backbone's weights as people save them (`save_weights`), from a backbone unlike a fresh one."""
    import keras

    from trainserve.training.transfer import backbone

    keras.utils.set_random_seed(seed)
    net = backbone(ARCH, (32, 32, 3))
    net.save_weights(str(path))
    return net.get_weights()


@pytest.mark.integration
def test_the_backbone_holds_the_weights_file_it_was_given(tmp_path):
    import keras

    from trainserve.training import model_fn
    from trainserve.training.transfer import BACKBONE, load_backbone_weights

    saved = _weights_file(tmp_path / "backbone.weights.h5")
    keras.utils.set_random_seed(0)
    model = model_fn.build(ARCH, _spec())
    before = model.get_layer(BACKBONE).get_weights()
    assert not all(np.array_equal(a, b) for a, b in zip(before, saved))  # a fresh backbone differs
    load_backbone_weights(model, ARCH, str(tmp_path / "backbone.weights.h5"))
    loaded = model.get_layer(BACKBONE).get_weights()
    assert len(loaded) == len(saved) and all(np.array_equal(a, b) for a, b in zip(loaded, saved))


@pytest.mark.integration
@pytest.mark.parametrize(
    "weights, fragment",
    [
        ("missing.weights.h5", "expected imagenet, none or an existing FILE.weights.h5"),
        ("wrong.weights.h5", "does not fit"),
    ],
)
def test_a_weights_file_that_is_missing_or_does_not_fit_is_one_line(tmp_path, weights, fragment):
    import keras

    from trainserve.training import model_fn
    from trainserve.training.transfer import load_backbone_weights

    small = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    small.save_weights(str(tmp_path / "wrong.weights.h5"))
    model = model_fn.build(ARCH, _spec())
    with pytest.raises(TrainserveError, match=fragment):
        load_backbone_weights(model, ARCH, str(tmp_path / weights))


@pytest.mark.unit
def test_a_backbone_refuses_images_smaller_than_it_supports():
    from trainserve.training import model_fn

    with pytest.raises(TrainserveError, match="at least 32x32"):
        model_fn.build(ARCH, _spec(16))


@pytest.mark.integration
def test_frozen_then_fine_tuned_run_passes_the_cpu_gate_and_publishes(tmp_path):
    photos = write_image_folder(tmp_path / "photos", per_class=4)
    _weights_file(tmp_path / "backbone.weights.h5")
    proc = run_cli(
        "train",
        "--data",
        f"{photos}/",
        "--architecture",
        ARCH,
        "--image-size",
        "32,32",
        "--weights",
        tmp_path / "backbone.weights.h5",
        "--epochs",
        "2",
        "--frozen-epochs",
        "1",
        "--batch-size",
        "8",
        "--model-name",
        "tl",
        "--export-base",
        tmp_path / "models",
        "--data-dir",
        tmp_path / "data",
        "--logs-dir",
        tmp_path / "logs",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for line in ("backbone weights: ", "backbone frozen for 1 epoch(s)", "fine-tuned from epoch 2", "CPU gate passed"):
        assert line in proc.stderr, proc.stderr[-3000:]
    assert (tmp_path / "models" / "tl" / "1" / "saved_model.pb").is_file()
    assert len((tmp_path / "logs" / "history.csv").read_text().strip().splitlines()) == 3  # header + both phases


@pytest.mark.unit
def test_each_phase_fits_with_its_optimizer_built_so_the_first_step_traces_once():
    """Built inside fit's first traced step instead, the optimizer's variables make TensorFlow trace it twice
    (MobileNetV3's first fine-tuning epoch on a CPU: 16 s instead of 11 s)."""
    import keras

    from trainserve.training.transfer import BACKBONE, fit_frozen_then_fine_tuned

    inputs = keras.Input((4,))
    inner = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)], name=BACKBONE)
    model = keras.Model(inputs, keras.layers.Dense(2)(inner(inputs)))
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    phases = []

    def fit(epochs, initial_epoch):
        phases.append((initial_epoch, model.optimizer.built, len(model.optimizer.variables)))

    fit_frozen_then_fine_tuned(
        model, fit, epochs=2, frozen_epochs=1, fine_tune_lr=1e-4, history=keras.callbacks.Callback()
    )
    # Adam: iterations and learning rate, then a momentum and a velocity per trainable weight (2 head, 4 all)
    assert phases == [(0, True, 2 + 2 * 2), (1, True, 2 + 2 * 4)]


@pytest.mark.unit
def test_a_compiled_model_comes_with_its_optimizer_built():
    from trainserve.task import Task
    from trainserve.training.model import build_for_training
    from trainserve.training.model_fn import data_spec

    spec = data_spec({"x": np.zeros((8, 4), "float32")}, Task("classification", classes=3))
    model = build_for_training("mlp", spec, learning_rate=0.01)
    assert model.optimizer.built and len(model.optimizer.variables) == 2 + 2 * len(model.trainable_variables)
