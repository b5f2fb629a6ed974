"""Training under MultiWorkerMirroredStrategy: a custom loop, because Keras 3's fit does not support that
strategy (keras#20585).

Each global batch is split across all replicas of all workers and the optimizer all-reduces the
gradients, so every worker ends with the same weights (`weights_digest`, in each worker's run summary,
shows it). Evaluation is plain forward passes with no collectives, so it is safe on every worker, even
after the others have finished.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

import keras
import numpy as np

from trainserve.training.pipeline import Batches

log = logging.getLogger(__name__)


@dataclass
class Evaluation:
    loss: float
    accuracy: float


@dataclass
class EpochTotals:
    """One epoch of training, summed over all workers, except `seen_here`."""

    loss_sum: float = 0.0
    hits: int = 0
    examples: int = 0
    steps: int = 0
    seen_here: int = 0  # examples this worker itself processed

    def logs(self, validation: Evaluation) -> dict[str, float]:
        """The epoch's numbers under the names Keras' fit reports them by (CSVLogger's columns)."""
        return {
            "accuracy": self.hits / max(self.examples, 1),
            "loss": self.loss_sum / max(self.steps, 1),
            "val_accuracy": validation.accuracy,
            "val_loss": validation.loss,
        }


def weights_digest(model) -> str:
    """sha256 of every weight: equal across workers exactly when their models are identical."""
    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(np.ascontiguousarray(weight).tobytes())
    return digest.hexdigest()


def evaluate_locally(model, test_ds) -> Evaluation:
    """Held-out loss and accuracy by plain forward passes (no collectives: safe on every worker)."""
    loss_sum, correct, count = 0.0, 0, 0
    for images, labels in test_ds:
        probabilities = np.asarray(model(images, training=False), np.float64)
        labels = labels.numpy()
        picked = np.clip(probabilities[np.arange(len(labels)), labels], 1e-7, 1.0)
        loss_sum += float(-np.log(picked).sum())
        correct += int((probabilities.argmax(axis=1) == labels).sum())
        count += len(labels)
    return Evaluation(loss_sum / count, correct / count)


def fit_multi_worker(
    strategy,
    model: keras.Model,
    batches: Batches,
    *,
    epochs: int,
    global_batch: int,
    learning_rate: float,
    mixed_precision: bool,
    callbacks: list[keras.callbacks.Callback],
) -> int:
    """Train `model` (built under `strategy`) for `epochs`, reporting each epoch to `callbacks` as fit
    would; returns how many training examples this worker itself processed."""
    import tensorflow as tf

    with strategy.scope():
        optimizer = keras.optimizers.Adam(learning_rate)
        if mixed_precision:
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        optimizer.build(model.trainable_variables)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    distributed = strategy.experimental_distribute_dataset(batches.train.with_options(options))
    step = _make_train_step(strategy, model, optimizer, global_batch)

    seen_here = 0
    for callback in callbacks:
        callback.set_model(model)
        callback.on_train_begin()
    for epoch in range(epochs):
        for callback in callbacks:
            callback.on_epoch_begin(epoch)
        totals = _train_one_epoch(strategy, step, distributed)
        seen_here += totals.seen_here
        logs = totals.logs(evaluate_locally(model, batches.test))
        log.info("epoch %d/%d: %s", epoch + 1, epochs, ", ".join(f"{k} {v:.4f}" for k, v in logs.items()))
        for callback in callbacks:
            callback.on_epoch_end(epoch, logs)
    for callback in callbacks:
        callback.on_train_end()
    return seen_here


def _make_train_step(strategy, model: keras.Model, optimizer, global_batch: int):
    """One distributed step; each replica returns its loss share, its correct predictions and its batch size."""
    import tensorflow as tf

    def replica_step(images, labels):
        with tf.GradientTape() as tape:
            probabilities = model(images, training=True)
            per_example = keras.losses.sparse_categorical_crossentropy(labels, probabilities)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            scaled = optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        hits = tf.reduce_sum(tf.cast(tf.argmax(probabilities, axis=-1) == labels, tf.int64))
        return loss, hits, tf.shape(images, out_type=tf.int64)[0]

    @tf.function
    def step(images, labels):
        return strategy.run(replica_step, args=(images, labels))

    return step


def _train_one_epoch(strategy, step, distributed) -> EpochTotals:
    import tensorflow as tf

    total = tf.distribute.ReduceOp.SUM
    totals = EpochTotals()
    for images, labels in distributed:
        loss, hits, count = step(images, labels)
        totals.loss_sum += float(strategy.reduce(total, loss, axis=None))
        totals.hits += int(strategy.reduce(total, hits, axis=None))
        totals.examples += int(strategy.reduce(total, count, axis=None))
        totals.seen_here += sum(int(c) for c in strategy.experimental_local_results(count))
        totals.steps += 1
    return totals
