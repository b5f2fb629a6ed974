"""Data as people have it: scikit-learn's bundled iris as CSV files with the species names as labels, a
text column (`petal_size`: small / medium / large) and empty cells, trained with no encoding by hand.

    python examples/iris_categories.py data/iris          # writes data/iris/train.csv and test.csv
    trainserve train --data data/iris/train.csv --label-column species \\
        --model-fn examples/iris_categories.py:build_model --model-name iris --epochs 60
    trainserve eval --model iris --data data/iris/test.csv --label-column species

trainserve types the columns by content and puts the preprocessing inside the model: numbers are
normalized (an empty cell becomes the mean plus a missing-value indicator), `petal_size` is looked up in
the values training saw (with an out-of-vocabulary bucket), the species become classes 0..2 named
setosa / versicolor / virginica. `build_model` gets the preprocessed `features` vector. The served model
takes the raw columns: `{"instances": [{"sepal_length": 5.1, ..., "petal_size": "small"}]}` over REST.
test.csv holds one petal_size training never saw ("tiny"): it is served through the OOV bucket and
counted in the eval report's `unknown_categories`.
"""

import sys
from pathlib import Path

import keras
import numpy as np

SIZES = ("small", "medium", "large")


def build_model(spec):
    inputs = spec.keras_inputs()  # {"features": float32 [F]}
    x = keras.layers.Dense(16, activation="relu")(inputs["features"])
    outputs = keras.layers.Dense(spec.task.classes, activation="softmax", dtype="float32")(x)
    return keras.Model(inputs, outputs)  # uncompiled: trainserve compiles it (cross-entropy, accuracy)


def write_data(directory: str, seed: int = 0) -> None:
    from sklearn.datasets import load_iris

    iris = load_iris()
    rng = np.random.default_rng(seed)
    x, species = iris.data, iris.target_names[iris.target]
    size = np.array(SIZES)[np.digitize(x[:, 3], np.quantile(x[:, 3], [1 / 3, 2 / 3]))]
    rows = [
        {"sepal_length": f"{a:.1f}", "sepal_width": f"{b:.1f}", "petal_length": f"{c:.1f}", "petal_size": s,
         "species": name}
        for (a, b, c, _), s, name in zip(x, size, species)
    ]  # fmt: skip
    for row in rng.choice(rows, 12, replace=False):  # empty cells: missing values
        row[rng.choice(["sepal_width", "petal_size"])] = ""
    order = rng.permutation(len(rows))
    test = [rows[i] for i in order[:30]]
    test[0] = {**test[0], "petal_size": "tiny"}  # a category training never saw
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    _write(out / "train.csv", [rows[i] for i in order[30:]])
    _write(out / "test.csv", test)


def _write(path: Path, rows: list[dict]) -> None:
    header = list(rows[0])
    path.write_text("\n".join([",".join(header)] + [",".join(r[h] for h in header) for r in rows]) + "\n")


if __name__ == "__main__":
    write_data(sys.argv[1])
