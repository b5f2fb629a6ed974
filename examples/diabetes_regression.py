"""Tabular regression: scikit-learn's bundled diabetes data (442 patients, 10 features, offline).

    python examples/diabetes_regression.py data/diabetes.npz      # writes the data set
    trainserve train --data data/diabetes.npz --model-fn examples/diabetes_regression.py:build_model \\
        --model-name diabetes --epochs 60

One float32 input `x` [N, 10]; float labels [N] -> regression with one target: the served model answers
`predictions` [N, 1]. Normalization learns the features' mean and variance from `spec.sample`.
"""

import sys

import keras
import numpy as np


def build_model(spec):
    inputs = spec.keras_inputs()  # {"x": keras.Input((10,), name="x")}
    normalize = keras.layers.Normalization()
    normalize.adapt(spec.sample["x"])
    x = normalize(inputs["x"])
    x = keras.layers.Dense(32, activation="relu")(x)
    outputs = keras.layers.Dense(spec.task.targets, dtype="float32")(x)
    model = keras.Model(inputs, outputs)
    # Our own loss, optimizer and metrics: trainserve keeps a compiled model's choices.
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse", metrics=["mae"])
    return model


def write_data(path: str, seed: int = 0) -> None:
    from sklearn.datasets import load_diabetes

    x, y = load_diabetes(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order].astype(np.float32), (y[order] / 100.0).astype(np.float32)  # targets in hundreds
    cut = int(len(x) * 0.8)
    np.savez(path, x_train=x[:cut], y_train=y[:cut], x_test=x[cut:], y_test=y[cut:])


if __name__ == "__main__":
    write_data(sys.argv[1])
