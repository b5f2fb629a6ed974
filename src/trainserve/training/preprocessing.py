"""Preprocessing inside the model for tabular data (a CSV's columns), so the served graph takes raw columns.

Computed on the training split only, then built from Keras preprocessing layers in front of the model and
exported with it (the training/serving skew tf.Transform exists for cannot happen: one graph does both):

    number column (float32 [N], NaN: missing)      Normalization(mean, variance), NaN -> 0 (the mean), and a
                                                   missing-value indicator when the training split had NaN
    category column (str [N], "": missing)         StringLookup(vocabulary = the values seen in training,
                                                   "" included when seen; one OOV bucket), one-hot

The features are concatenated in column order into `features` float32 [N, F]. Vocabularies, means and
variances are constructor arguments, not adapted state, so the export's rebuild reproduces them exactly.
`features()` is the same computation in numpy: the sample `--model-fn` functions see, and tests' reference.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np

FEATURES = "features"  # the one input a --model-fn model gets for tabular data (unless it asks for raw_inputs)
OOV_TOKEN = "\x00[UNK]"  # StringLookup's OOV token may not be in the vocabulary: a value unlikely in a CSV
EPSILON = 1e-7  # keras.backend.epsilon(): Normalization divides by max(sqrt(variance), epsilon)


@dataclass(frozen=True)
class ColumnPlan:
    """How one column becomes features."""

    name: str
    kind: Literal["number", "category"]
    mean: float = 0.0
    variance: float = 1.0
    indicator: bool = False  # number: a 0/1 missing-value feature (the training split had missing cells)
    vocabulary: tuple[str, ...] = ()  # category: sorted values seen in training; index 0 is the OOV bucket

    @property
    def width(self) -> int:
        return 1 + self.indicator if self.kind == "number" else len(self.vocabulary) + 1


@dataclass(frozen=True)
class Preprocessing:
    columns: tuple[ColumnPlan, ...]

    @property
    def width(self) -> int:
        return sum(c.width for c in self.columns)

    @property
    def categories(self) -> tuple[ColumnPlan, ...]:
        return tuple(c for c in self.columns if c.kind == "category")

    def to_json(self) -> list[dict]:
        return [asdict(c) for c in self.columns]

    @classmethod
    def from_json(cls, raw: list[dict]) -> Preprocessing:
        return cls(tuple(ColumnPlan(**{**c, "vocabulary": tuple(c["vocabulary"])}) for c in raw))

    def features(self, columns: dict[str, np.ndarray]) -> np.ndarray:
        """float32 [N, F]: what the layers compute, in numpy."""
        parts = []
        for column in self.columns:
            x = np.asarray(columns[column.name]).reshape(-1, 1)
            if column.kind == "number":
                x = x.astype(np.float32)
                scale = max(np.sqrt(np.float32(column.variance)), np.float32(EPSILON))
                z = (x - np.float32(column.mean)) / scale
                missing = np.isnan(x)
                parts.append(np.where(missing, np.float32(0), z))
                if column.indicator:
                    parts.append(missing.astype(np.float32))
            else:
                index = {v: i + 1 for i, v in enumerate(column.vocabulary)}
                ids = np.array([index.get(_text(v), 0) for v in x[:, 0]], np.int64)
                parts.append(np.eye(column.width, dtype=np.float32)[ids])
        return np.concatenate(parts, axis=1).astype(np.float32)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def plan_preprocessing(train: dict[str, np.ndarray]) -> Preprocessing:
    """Each column's statistics or vocabulary, from the training split."""
    columns = []
    for name, values in train.items():
        x = values.reshape(len(values), -1)[:, 0]
        if x.dtype.kind in "USO":
            vocabulary = tuple(sorted({_text(v) for v in x} - {OOV_TOKEN}))  # that value: in the OOV bucket
            columns.append(ColumnPlan(name, "category", vocabulary=vocabulary))
            continue
        x = x.astype(np.float64)
        seen = x[~np.isnan(x)]
        mean, variance = (float(seen.mean()), float(seen.var())) if seen.size else (0.0, 1.0)
        columns.append(ColumnPlan(name, "number", mean, variance, bool(seen.size < x.size)))
    return Preprocessing(tuple(columns))


def feature_layers(plan: Preprocessing, inputs: dict):
    """The Keras layers of `plan` applied to the raw `inputs` (KerasTensors by column name): `features`."""
    import keras

    parts = []
    for column in plan.columns:
        x = keras.ops.reshape(inputs[column.name], (-1, 1))  # [N] (one value per example) -> [N, 1]
        if column.kind == "number":
            normalized = keras.layers.Normalization(
                mean=column.mean, variance=column.variance, dtype="float32", name=f"normalize_{column.name}"
            )(x)
            missing = _missing_values_layer()(column.indicator, dtype="float32", name=f"missing_{column.name}")
            parts.append(missing(normalized))
        else:
            lookup = keras.layers.StringLookup(
                vocabulary=list(column.vocabulary),
                num_oov_indices=1,
                oov_token=OOV_TOKEN,
                output_mode="one_hot",
                name=f"lookup_{column.name}",
            )
            parts.append(keras.ops.cast(lookup(x), "float32"))
    if len(parts) == 1:
        return parts[0]
    return keras.layers.Concatenate(name=FEATURES, dtype="float32")(parts)


@functools.cache
def _missing_values_layer():
    """A layer: NaN -> 0 (after normalization: the mean), plus a 0/1 missing indicator when asked."""
    import keras

    class MissingValues(keras.layers.Layer):
        def __init__(self, indicator: bool = False, **kwargs):
            super().__init__(**kwargs)
            self.indicator = indicator

        def call(self, x):
            missing = keras.ops.isnan(x)
            filled = keras.ops.where(missing, keras.ops.zeros_like(x), x)
            if not self.indicator:
                return filled
            return keras.ops.concatenate([filled, keras.ops.cast(missing, x.dtype)], axis=-1)

        def compute_output_shape(self, shape):
            return (*shape[:-1], shape[-1] * (2 if self.indicator else 1))

        def get_config(self):
            return {**super().get_config(), "indicator": self.indicator}

    return MissingValues


def counts_unknown_categories(plan: Preprocessing | None) -> bool:
    """Whether the served signature answers `unknown_categories`: only category columns have values to miss."""
    return plan is not None and bool(plan.categories)


def unknown_categories(plan: Preprocessing, inputs: dict):
    """int64 [N]: per example, how many category cells hold a value training never saw (served through the
    OOV bucket; an empty cell is missing, not unknown). TensorFlow ops on the signature's inputs."""
    import tensorflow as tf

    count = None
    for column in plan.categories:
        x = tf.reshape(inputs[column.name], [-1, 1])
        known = tf.reduce_any(tf.equal(x, tf.constant(list(column.vocabulary) or [OOV_TOKEN])[tf.newaxis, :]), -1)
        unknown = tf.cast(tf.logical_and(tf.logical_not(known), tf.not_equal(x[:, 0], "")), tf.int64)
        count = unknown if count is None else count + unknown
    return count
