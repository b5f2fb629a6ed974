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

from trainserve.layout import CLASSES, PREDICTIONS, PROBABILITIES, Task
from trainserve.training.pipeline import Batches

log = logging.getLogger(__name__)


@dataclass
class EpochTotals:
    """One epoch of training, summed over all workers, except `seen_here`."""

    loss_sum: float = 0.0
    hits: int = 0
    examples: int = 0
    steps: int = 0
    seen_here: int = 0  # examples this worker itself processed

    def logs(self, task: Task, validation: dict[str, float] | None) -> dict[str, float]:
        """The epoch's numbers under the names Keras' fit reports them by (CSVLogger's columns)."""
        logs = {"loss": self.loss_sum / max(self.steps, 1)}
        if task.kind == "classification":
            logs["accuracy"] = self.hits / max(self.examples, 1)
        return logs | {f"val_{k}": v for k, v in (validation or {}).items()}


def weights_digest(model) -> str:
    """sha256 of every weight: equal across workers exactly when their models are identical."""
    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(np.ascontiguousarray(weight).tobytes())
    return digest.hexdigest()


def evaluate_locally(model, dataset, task: Task) -> dict[str, float]:
    """Held-out metrics by plain forward passes (no collectives: safe on every worker): classification
    `loss` (cross-entropy) and `accuracy`; regression `loss` (mean squared error) and `mae`."""
    from trainserve.training.export import serving_outputs

    sums, count = {"loss": 0.0, "accuracy" if task.kind == "classification" else "mae": 0.0}, 0
    for inputs, labels in dataset:
        outputs = serving_outputs(model(inputs, training=False), task)
        labels = labels.numpy()
        if task.kind == "classification":
            probabilities = np.asarray(outputs[PROBABILITIES], np.float64)
            picked = np.clip(probabilities[np.arange(len(labels)), labels], 1e-7, 1.0)
            sums["loss"] += float(-np.log(picked).sum())
            sums["accuracy"] += float((outputs[CLASSES].numpy() == labels).sum())
        else:
            error = np.asarray(outputs[PREDICTIONS], np.float64) - labels.reshape(len(labels), -1)
            sums["loss"] += float((error**2).mean(axis=1).sum())
            sums["mae"] += float(np.abs(error).mean(axis=1).sum())
        count += len(labels)
    return {k: v / max(count, 1) for k, v in sums.items()}


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
    task: Task,
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
    step = _make_train_step(strategy, model, optimizer, global_batch, task)

    seen_here = 0
    for callback in callbacks:
        callback.set_model(model)
        callback.on_train_begin()
    for epoch in range(epochs):
        for callback in callbacks:
            callback.on_epoch_begin(epoch)
        totals = _train_one_epoch(strategy, step, distributed)
        seen_here += totals.seen_here
        validation = evaluate_locally(model, batches.validation, task) if batches.validation is not None else None
        logs = totals.logs(task, validation)
        log.info("epoch %d/%d: %s", epoch + 1, epochs, ", ".join(f"{k} {v:.4f}" for k, v in logs.items()))
        for callback in callbacks:
            callback.on_epoch_end(epoch, logs)
    for callback in callbacks:
        callback.on_train_end()
    return seen_here


def _make_train_step(strategy, model: keras.Model, optimizer, global_batch: int, task: Task):
    """One distributed step; each replica returns its loss share, its correct predictions and its batch size."""
    import tensorflow as tf

    from trainserve.training.export import serving_outputs
    from trainserve.training.model import task_loss

    units = int(model.outputs[0].shape[-1]) if len(model.outputs[0].shape) == 2 else 1
    loss_fn = keras.losses.get(task_loss(task, units))

    def replica_step(inputs, labels):
        with tf.GradientTape() as tape:
            outputs = model(inputs, training=True)
            per_example = loss_fn(labels, outputs)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            scaled = optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        hits = tf.constant(0, tf.int64)
        if task.kind == "classification":
            classes = serving_outputs(outputs, task)[CLASSES]
            hits = tf.reduce_sum(tf.cast(classes == tf.cast(labels, tf.int64), tf.int64))
        return loss, hits, tf.shape(labels, out_type=tf.int64)[0]

    @tf.function
    def step(inputs, labels):
        return strategy.run(replica_step, args=(inputs, labels))

    return step


def _train_one_epoch(strategy, step, distributed) -> EpochTotals:
    import tensorflow as tf

    total = tf.distribute.ReduceOp.SUM
    totals = EpochTotals()
    for inputs, labels in distributed:
        loss, hits, count = step(inputs, labels)
        totals.loss_sum += float(strategy.reduce(total, loss, axis=None))
        totals.hits += int(strategy.reduce(total, hits, axis=None))
        totals.examples += int(strategy.reduce(total, count, axis=None))
        totals.seen_here += sum(int(c) for c in strategy.experimental_local_results(count))
        totals.steps += 1
    return totals
