"""Binary classification with two inputs of different dtypes: scikit-learn's bundled breast-cancer
features (float32 [N, 30]) plus an integer category (int64 [N, 1]: which quartile the tumour's mean
radius falls in), embedded.

    python examples/breast_cancer_two_inputs.py data/cancer.npz
    trainserve train --data data/cancer.npz --model-fn examples/breast_cancer_two_inputs.py:build_model \\
        --model-name cancer --epochs 20 --learning-rate 0.01

The .npz holds `x_train/features`, `x_train/radius_bucket` (and `x_test/...`): the model's inputs are
named after them. The sigmoid unit is served as `probabilities` [N, 2] ([1 - p, p]) and `classes`.
"""

import sys

import keras
import numpy as np


def build_model(spec):
    inputs = spec.keras_inputs()
    normalize = keras.layers.Normalization()
    normalize.adapt(spec.sample["features"])
    features = normalize(inputs["features"])
    bucket = keras.layers.Flatten()(keras.layers.Embedding(4, 3)(inputs["radius_bucket"]))
    x = keras.layers.Concatenate()([features, bucket])
    x = keras.layers.Dense(16, activation="relu")(x)
    outputs = keras.layers.Dense(1, activation="sigmoid", dtype="float32")(x)
    return keras.Model(inputs, outputs)  # uncompiled: trainserve compiles it (binary cross-entropy, accuracy)


def write_data(path: str, seed: int = 0) -> None:
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    x, y = data.data.astype(np.float32), data.target.astype(np.int64)
    edges = np.quantile(x[:, 0], [0.25, 0.5, 0.75])
    bucket = np.digitize(x[:, 0], edges).astype(np.int64)[:, np.newaxis]
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(len(x) * 0.8)
    train, test = order[:cut], order[cut:]
    np.savez(
        path,
        **{"x_train/features": x[train], "x_train/radius_bucket": bucket[train], "y_train": y[train]},
        **{"x_test/features": x[test], "x_test/radius_bucket": bucket[test], "y_test": y[test]},
        label_names=np.array(data.target_names),
    )


if __name__ == "__main__":
    write_data(sys.argv[1])
