"""The built-in models (`--architecture cnn|mlp`): two `--model-fn` functions like any other; `auto` picks
one from the data (`default_architecture`). Transfer-learning backbones are in training/transfer.py.

They take uint8 images `images` [N, H, W, C] and scale them to [0, 1] in their first layer, so training
and the serving graph preprocess identically. `mlp` also takes tabular data (a CSV): the preprocessed
`features` [F], for classification or regression. The softmax is its own layer with dtype float32, so under
mixed_float16 the probabilities are still computed in float32 (Keras' mixed-precision guide).
"""

from __future__ import annotations

import keras
import numpy as np

from trainserve.errors import TrainserveError
from trainserve.training.model_fn import DataSpec
from trainserve.training.preprocessing import FEATURES


def cnn(spec: DataSpec) -> keras.Model:
    """Keras' mnist_convnet example with half the filters: pooling after each conv keeps the compute small
    enough for cheap CPU serving (docs/serving-on-cpus.md has the numbers)."""
    inputs, x = _scaled_images(spec)
    height, width = spec.inputs[0].shape[:2]
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(x)
    x = keras.layers.MaxPooling2D(2)(x) if min(height, width) >= 2 else x
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    x = keras.layers.MaxPooling2D(2)(x) if min(height, width) >= 4 else x
    side = min(height, width) // 4
    for _ in range(3):  # larger images (a folder's --image-size): one more block per halving down to 8 pixels
        if side < 16:
            break
        x = keras.layers.Conv2D(64, 3, padding="same", activation="relu")(x)
        x = keras.layers.MaxPooling2D(2)(x)
        side //= 2
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dropout(0.5)(x)
    return _head(inputs, x, spec, "trainserve_cnn")


def default_architecture(spec: DataSpec) -> str:
    """What `--architecture auto` trains: cnn for images (uint8 [H, W, C], image files), mlp for the rest."""
    image = len(spec.inputs) == 1 and len(spec.inputs[0].shape) == 3 and spec.inputs[0].dtype == "uint8"
    return "cnn" if image and spec.task.kind == "classification" else "mlp"


def auto(spec: DataSpec) -> keras.Model:
    """`--architecture auto`: the model `default_architecture` picks for the data."""
    return cnn(spec) if default_architecture(spec) == "cnn" else mlp(spec)


def mlp(spec: DataSpec) -> keras.Model:
    if spec.preprocessing is not None:
        return _tabular_mlp(spec)
    if default_architecture(spec) != "cnn":
        return _array_mlp(spec)
    inputs, x = _scaled_images(spec)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(256, activation="relu")(x)
    x = keras.layers.Dropout(0.2)(x)
    x = keras.layers.Dense(128, activation="relu")(x)
    return _head(inputs, x, spec, "trainserve_mlp")


def _tabular_mlp(spec: DataSpec) -> keras.Model:
    """Two small hidden layers over the preprocessed features; softmax or linear head by task."""
    inputs = spec.keras_inputs()
    x = keras.layers.Dense(32, activation="relu")(inputs[FEATURES])
    x = keras.layers.Dense(16, activation="relu")(x)
    if spec.task.kind == "regression":
        outputs = keras.layers.Dense(spec.task.targets, dtype="float32", name="predictions")(x)
        return keras.Model(inputs, outputs, name="trainserve_mlp")
    return _head(inputs, x, spec, "trainserve_mlp")


def _array_mlp(spec: DataSpec) -> keras.Model:
    """Numeric arrays ([N, F], or any shape, flattened): standardised with the training sample's mean and
    variance (constructor arguments, so the export's rebuild has them), then two small hidden layers."""
    if len(spec.inputs) != 1:
        raise TrainserveError(
            f"the built-in mlp takes one input: got {', '.join(spec.names)} (use --model-fn for several arrays)"
        )
    (only,) = spec.inputs
    inputs = keras.Input(shape=only.shape, name=only.name)
    x = keras.layers.Flatten()(keras.ops.cast(inputs, "float32"))
    sample = np.asarray(spec.sample.get(only.name, np.zeros((1, *only.shape))), np.float64).reshape(-1, x.shape[-1])
    x = keras.layers.Normalization(mean=sample.mean(axis=0), variance=sample.var(axis=0) + 1e-6)(x)
    x = keras.layers.Dense(64, activation="relu")(x)
    x = keras.layers.Dense(32, activation="relu")(x)
    if spec.task.kind == "regression":
        outputs = keras.layers.Dense(spec.task.targets, dtype="float32", name="predictions")(x)
        return keras.Model(inputs, outputs, name="trainserve_mlp")
    return _head(inputs, x, spec, "trainserve_mlp")


def _scaled_images(spec: DataSpec):
    if spec.preprocessing is not None:
        raise TrainserveError(
            "the built-in cnn classifies images and the data is a table (a .csv): expected --architecture mlp"
            " or --model-fn"
        )
    if len(spec.inputs) != 1 or len(spec.inputs[0].shape) != 3 or spec.task.kind != "classification":
        raise TrainserveError(
            f"the built-in models classify images: expected one input [N, H, W, C], got {list(spec.inputs)}"
            f" and a {spec.task.kind} task (use --model-fn for other data)"
        )
    (name, shape) = spec.inputs[0].name, spec.inputs[0].shape
    inputs = keras.Input(shape=shape, name=name)
    return inputs, keras.layers.Rescaling(1.0 / 255.0, name="scale")(inputs)


def _head(inputs, x, spec: DataSpec, name: str) -> keras.Model:
    logits = keras.layers.Dense(spec.task.classes, name="logits")(x)
    outputs = keras.layers.Activation("softmax", dtype="float32", name="probabilities")(logits)
    return keras.Model(inputs, outputs, name=name)
