"""The training input pipeline: named inputs and labels as tf.data, batched for the strategy.

The data goes in as it is stored (uint8 images, int64 ids, float features): preprocessing such as
scaling belongs inside the model, so the exported serving graph does exactly what training did.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from trainserve.data import Dataset
from trainserve.training.images import ImagePipeline, image_file_pipeline


def make_input_pipeline(x, y: np.ndarray, global_batch: int, seed: int, training: bool, structure=None):
    """tf.data on the CPU: cache the stored arrays (`x`: one array, or a dict of named inputs), shuffle,
    batch, prefetch. Caching the raw arrays (uint8 images are 4x smaller than float32) keeps the
    accelerator fed without a Python loop in the way. `structure` maps the dict of inputs to the model's."""
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices((x, y)).cache()
    if training:
        ds = ds.shuffle(min(len(y), 50_000), seed=seed, reshuffle_each_iteration=True)
    # Training drops the ragged last batch (reshuffled away next epoch): every step then has full,
    # evenly split per-replica batches, which gradient accumulation's micro-batches rely on.
    ds = ds.batch(global_batch, drop_remainder=training and len(y) >= global_batch)
    if structure is not None:
        ds = ds.map(lambda inputs, labels: (structure(inputs), labels))
    return ds.prefetch(tf.data.AUTOTUNE)


@dataclass
class Batches:
    """One run's tf.data pipelines."""

    train: Any  # shuffled step batches: --grad-accum K global batches each, sliced inside the train step
    validation: Any  # carved from the training data: the per-epoch metrics (None: --validation-split 0)
    test: Any  # the held-out split: the final evaluation only
    train_examples: int = 0


def make_batches(
    dataset: Dataset,
    global_batch: int,
    grad_accum: int,
    seed: int,
    validation_split: float,
    structure=None,
    images: ImagePipeline | None = None,
) -> Batches:
    """The pipelines over `dataset` for a run with this global batch; `validation_split` of the training
    examples (drawn with `seed`) become the validation set. The test split never steers training. Image
    files (`dataset.image`) stream through `images`' pipeline, decoded as the served model decodes them."""
    x_train, y_train, x_val, y_val = dataset.split_validation(validation_split, seed)
    step_batch = global_batch * grad_accum
    structure = structure or (lambda inputs: inputs)

    def pipeline(x, y, batch, training):
        if dataset.image is None:
            return make_input_pipeline(x, y, batch, seed, training=training, structure=structure)
        files = next(iter(x.values()))
        return image_file_pipeline(files, y, batch, seed, training, images or ImagePipeline(dataset.image), structure)

    return Batches(
        train=pipeline(x_train, y_train, step_batch, True),
        validation=pipeline(x_val, y_val, global_batch, False) if len(y_val) else None,
        test=pipeline(dataset.test, dataset.y_test, global_batch, False),
        train_examples=len(y_train),
    )
