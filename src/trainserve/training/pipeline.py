"""The training input pipeline, and the preprocessing that training and the serving signature share.

Scaling uint8 images to float happens in `preprocess`, which both the tf.data pipeline and the exported
serving signature call, so the model sees identically preprocessed data in training and in TF Serving.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from trainserve.data import Dataset


def preprocess(images):
    """uint8 images -> float32 in [0, 1]. Runs in tf.data for training and inside the serving graph."""
    import tensorflow as tf

    return tf.cast(images, tf.float32) / 255.0


def make_input_pipeline(x: np.ndarray, y: np.ndarray, global_batch: int, seed: int, training: bool):
    """tf.data on the CPU: cache the raw uint8 data, shuffle, batch, parallel preprocess, prefetch.

    Caching the uint8 arrays (4x smaller than float32) and mapping per batch keeps the accelerator fed
    without a Python loop in the way.
    """
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices((x, y)).cache()
    if training:
        ds = ds.shuffle(min(len(x), 50_000), seed=seed, reshuffle_each_iteration=True)
    # Training drops the ragged last batch (reshuffled away next epoch): every step then has full,
    # evenly split per-replica batches, which gradient accumulation's micro-batches rely on.
    ds = ds.batch(global_batch, drop_remainder=training and len(x) >= global_batch)
    ds = ds.map(lambda images, labels: (preprocess(images), labels), num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE)


@dataclass
class Batches:
    """One run's tf.data pipelines."""

    train: Any  # shuffled step batches: --grad-accum K global batches each, sliced inside the train step
    test: Any  # the held-out split, in global batches


def make_batches(dataset: Dataset, global_batch: int, grad_accum: int, seed: int) -> Batches:
    """The training and held-out pipelines over `dataset` for a run with this global batch."""
    step_batch = global_batch * grad_accum
    return Batches(
        train=make_input_pipeline(dataset.x_train, dataset.y_train, step_batch, seed, training=True),
        test=make_input_pipeline(dataset.x_test, dataset.y_test, global_batch, seed, training=False),
    )
