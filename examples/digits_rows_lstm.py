"""A sequence model: the bundled digits read row by row (8 steps of 8 pixels) by an LSTM.

    python examples/digits_rows_lstm.py data/rows.npz
    trainserve train --data data/rows.npz --model-fn examples/digits_rows_lstm.py:build_model \\
        --model-name rows --epochs 15

On a GPU, Keras' LSTM runs the cuDNN kernel; trainserve traces the export in a process that sees no GPU,
so the published graph holds the CPU kernel and loads on a CPU-only TF Serving.
"""

import sys

import keras
import numpy as np


def build_model(spec):
    inputs = spec.keras_inputs()  # {"x": float32 [N, 8, 8]}
    x = keras.layers.LSTM(32)(inputs["x"])
    x = keras.layers.Dense(spec.task.classes, name="logits")(x)
    outputs = keras.layers.Activation("softmax", dtype="float32")(x)
    return keras.Model(inputs, outputs)


def write_data(path: str, seed: int = 0) -> None:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x, y = (digits.images / 16.0).astype(np.float32), digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(len(x) * 0.8)
    train, test = order[:cut], order[cut:]
    np.savez(path, x_train=x[train], y_train=y[train], x_test=x[test], y_test=y[test])


if __name__ == "__main__":
    write_data(sys.argv[1])
