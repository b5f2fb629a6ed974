"""Model construction, float32 re-export and gradient accumulation arithmetic."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from trainserve.training.model import GradientAccumulationModel, build_model, float32_copy


def _pair(micro_batches: int):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4, 4, 1))
    hidden = keras.layers.Dense(8, activation="relu")(keras.layers.Flatten()(inputs))
    outputs = keras.layers.Dense(3, activation="softmax")(hidden)
    plain = keras.Model(inputs, outputs)
    accumulating = GradientAccumulationModel(inputs, outputs, micro_batches=micro_batches)
    for model in (plain, accumulating):
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss="sparse_categorical_crossentropy")
    return plain, accumulating


@pytest.mark.parametrize("micro_batches, batch", [(2, 8), (4, 8), (3, 10)], ids=["2x4", "4x2", "uneven-3-of-10"])
def test_accumulated_step_equals_one_full_batch_step(micro_batches, batch):
    plain, accumulating = _pair(micro_batches)
    start = [w.copy() for w in plain.get_weights()]
    accumulating.set_weights(start)
    rng = np.random.default_rng(1)
    x = rng.random((batch, 4, 4, 1)).astype(np.float32)
    y = rng.integers(0, 3, batch)
    plain.train_on_batch(x, y)
    accumulating.train_on_batch(x, y)
    for a, b, s in zip(plain.get_weights(), accumulating.get_weights(), start):
        assert not np.allclose(a, s), "the step changed the weights"
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_float32_copy_of_a_mixed_precision_model_keeps_weights():
    keras.config.set_dtype_policy("mixed_float16")
    try:
        mixed = build_model("cnn", (8, 8, 1), 10)
    finally:
        keras.config.set_dtype_policy("float32")
    clone = float32_copy(mixed, "cnn")
    assert mixed.layers[1].compute_dtype == "float16" and clone.layers[1].compute_dtype == "float32"
    assert clone.get_layer("probabilities").compute_dtype == "float32"
    for a, b in zip(mixed.get_weights(), clone.get_weights()):
        np.testing.assert_array_equal(a, b)
    x = np.random.default_rng(0).random((4, 8, 8, 1)).astype(np.float32)
    np.testing.assert_allclose(mixed.predict(x, verbose=0), clone.predict(x, verbose=0), atol=1e-2)
