"""Preprocessing inside the model for a CSV's columns: the Keras layers compute what an independent numpy
computation does (normalization by the training split's statistics, NaN -> the mean plus an indicator,
one-hot over the training vocabulary with an OOV bucket), the exported SavedModel takes the raw columns and
answers the same, counting unseen categories; `raw_inputs = True` hands the columns to the function."""

from __future__ import annotations

import numpy as np
import pytest

from trainserve.task import Task
from trainserve.training.model_fn import data_spec
from trainserve.training.preprocessing import plan_preprocessing

pytestmark = pytest.mark.unit

TRAIN = {
    "size": np.array([1.0, np.nan, 3.0, 5.0, 6.0], np.float32),
    "count": np.array([2.0, 2.0, 4.0, 4.0, 8.0], np.float32),
    "colour": np.array(["red", "", "blue", "red", "green"]),
}
SERVED = {  # unseen "purple", a missing colour, a missing count (never missing in training)
    "size": np.array([2.0, np.nan, 7.0], np.float32),
    "count": np.array([np.nan, 3.0, 4.0], np.float32),
    "colour": np.array(["purple", "", "green"]),
}
TASK = Task("classification", classes=2, label_names=("no", "yes"))


def test_the_plan_comes_from_the_training_split():
    plan = {c.name: c for c in plan_preprocessing(TRAIN).columns}
    assert plan["size"].mean == pytest.approx(3.75) and plan["size"].variance == pytest.approx(np.var([1, 3, 5, 6]))
    assert plan["size"].indicator and not plan["count"].indicator
    assert plan["colour"].vocabulary == ("", "blue", "green", "red") and plan["colour"].width == 5


def test_layers_equal_an_independent_numpy_computation():
    import keras

    from trainserve.training.preprocessing import feature_layers

    spec = data_spec(TRAIN, TASK, tabular=True)
    raw = spec.keras_inputs()
    got = np.asarray(keras.Model(raw, feature_layers(spec.preprocessing, raw))(SERVED))
    size = (SERVED["size"] - 3.75) / np.sqrt(np.var([1, 3, 5, 6]))
    count = (SERVED["count"] - 4.0) / np.sqrt(np.var([2, 2, 4, 4, 8]))
    want = np.array(
        [
            [size[0], 0, 0, 1, 0, 0, 0, 0],  # a NaN count is its mean (0), no indicator: never missing
            [0, 1, count[1], 0, 1, 0, 0, 0],  # size missing: 0 and the indicator; colour "" is a category
            [size[2], 0, count[2], 0, 0, 0, 1, 0],
        ],
        np.float32,
    )
    np.testing.assert_allclose(got, want, atol=1e-6)
    np.testing.assert_allclose(spec.preprocessing.features(SERVED), want, atol=1e-6)


def _tiny(spec):
    import keras

    inputs = spec.keras_inputs()
    return keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(inputs["features"]))


def _raw(spec):
    import keras

    inputs = spec.keras_inputs()
    x = keras.layers.Concatenate()(
        [keras.ops.reshape(keras.ops.nan_to_num(inputs[n]), (-1, 1)) for n in spec.names if n != "colour"]
    )
    return keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(x))


_raw.raw_inputs = True


@pytest.mark.parametrize("function", ["_tiny", "_raw"])
def test_exported_model_takes_raw_columns_and_answers_as_in_process(function, tmp_path):
    import keras

    from trainserve.savedmodel import LoadedModel
    from trainserve.training.export import export_savedmodel, serving_outputs
    from trainserve.training.model import build_network

    keras.utils.set_random_seed(0)
    spec = data_spec(TRAIN, TASK, tabular=True)
    model = build_network(f"{__name__}:{function}", spec)
    assert sorted(t.name for t in model.inputs) == ["colour", "count", "size"]
    export_savedmodel(model, tmp_path / "1", spec.inputs, TASK, spec.preprocessing)
    loaded = LoadedModel(tmp_path / "1")
    wanted, outputs = loaded.signature("serving_default")
    assert {k: (v.dtype.kind, v.shape) for k, v in wanted.items()} == {
        "size": ("f", (None,)),
        "count": ("f", (None,)),
        "colour": ("O", (None,)),
    }
    served = loaded.run("serving_default", {**SERVED, "colour": SERVED["colour"].astype(object)})
    in_process = serving_outputs(model(SERVED, training=False), TASK)
    np.testing.assert_allclose(served["probabilities"], np.asarray(in_process["probabilities"]), atol=1e-6)
    assert served["unknown_categories"].tolist() == [1, 0, 0]  # "purple"; "" was seen in training
    names = np.array([b"no", b"yes"], dtype=object)
    assert served["class_names"].tolist() == names[served["classes"]].tolist()
    assert served["label_names"].tolist() == [[b"no", b"yes"]] * 3


def test_a_model_file_runs_once_for_a_tabular_network(tmp_path):
    """Resolving `file.py:fn` executes the user's file: building behind the preprocessing must do it once."""
    from trainserve.training.model import build_network

    runs = tmp_path / "runs"
    source = tmp_path / "mine.py"
    source.write_text(
        f"from pathlib import Path\nwith Path({str(runs)!r}).open('a') as fh:\n    fh.write('x')\n\n"
        "def build(spec):\n    import keras\n    inputs = spec.keras_inputs()\n"
        "    return keras.Model(inputs, keras.layers.Dense(2, activation='softmax')(inputs['features']))\n"
    )
    build_network(f"{source}:build", data_spec(TRAIN, TASK, tabular=True))
    assert runs.read_text() == "x"
