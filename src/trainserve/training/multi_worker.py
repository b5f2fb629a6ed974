"""Training under MultiWorkerMirroredStrategy: a custom loop, because Keras 3's fit does not support that
strategy (keras#20585).

Each global batch is split across all replicas of all workers and the optimizer all-reduces the
gradients, so every worker ends with the same weights (`weights_digest`, in each worker's run summary,
shows it). Evaluation is plain forward passes with no collectives, so it is safe on every worker, even
after the others have finished.

A lost worker: every finished epoch is checkpointed (`EpochCheckpoint`). When a worker dies, the others'
collectives fail within seconds (TensorFlow's coordination service stops hearing its heartbeats, or sees it
come back as a new process); they then exit with `WorkerLost.exit_code`, so the whole group restarts and
resumes after the last checkpointed epoch. A group restarts only as a whole: no worker may exit 0 before the
chief has published (`wait_for_all_workers`).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import keras
import numpy as np

from trainserve.errors import TrainserveError, first_line
from trainserve.layout import CLASSES, PREDICTIONS, PROBABILITIES
from trainserve.task import Task
from trainserve.training.cluster import WorkerLost
from trainserve.training.pipeline import Batches

log = logging.getLogger(__name__)

EPOCH_VARIABLE = "epoch/.ATTRIBUTES/VARIABLE_VALUE"  # the finished epochs, as tf.train.Checkpoint names them


@contextlib.contextmanager
def exit_when_a_worker_is_lost(enabled: bool) -> Iterator[None]:
    """Turn TensorFlow's error for a collective that lost a peer into `WorkerLost`."""
    import tensorflow as tf

    try:
        yield
    except (tf.errors.UnavailableError, tf.errors.AbortedError) as exc:
        if not enabled:
            raise
        reason = re.sub(r"^\{\{[^}]*\}\}\s*", "", first_line(exc))  # TF's "{{function_node ...}}" prefix
        raise WorkerLost(
            f"another worker was lost ({type(exc).__name__}: {reason}): exiting with code"
            f" {WorkerLost.exit_code} so that the whole group restarts and resumes after its last checkpointed epoch"
        ) from None


def wait_for_all_workers(strategy) -> None:
    """A barrier: returns once every worker has called it (one all-reduce of a scalar)."""
    import tensorflow as tf

    strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(1)), axis=None)


def checkpointed_epochs(directory: Path | None) -> int:
    """Epochs finished by the run whose checkpoints `directory` holds (0: none, a fresh start)."""
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(str(directory)) if directory is not None and directory.is_dir() else None
    return int(tf.train.load_variable(latest, EPOCH_VARIABLE)) if latest else 0


class EpochCheckpoint:
    """The model, the optimizer and the number of finished epochs, saved after every epoch.

    As TensorFlow's multi-worker guide prescribes: every worker saves (saving distributed variables may need
    collectives), but only the chief's copy, in `directory` on a volume every worker reaches, is kept; the
    others write to a temporary directory of their own and delete it at once. A restarted group restores the
    chief's latest checkpoint on every worker: an epoch cut short is simply trained again.
    """

    def __init__(self, directory: Path, is_chief: bool, **trackables):
        import tensorflow as tf

        self.directory, self.is_chief = directory, is_chief
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._checkpoint = tf.train.Checkpoint(epoch=self.epoch, **trackables)

    def restore(self) -> int:
        """Load the chief's latest checkpoint, if any; returns the epochs it had finished."""
        import tensorflow as tf

        latest = tf.train.latest_checkpoint(str(self.directory)) if self.directory.is_dir() else None
        if latest:
            self._checkpoint.restore(latest).assert_existing_objects_matched()
        return int(self.epoch.numpy())

    def save(self, epochs_done: int) -> None:
        import tensorflow as tf

        self.epoch.assign(epochs_done)
        target = self.directory if self.is_chief else Path(tempfile.mkdtemp(prefix="trainserve-checkpoint-"))
        tf.train.CheckpointManager(self._checkpoint, str(target), max_to_keep=1).save(checkpoint_number=epochs_done)
        if not self.is_chief:
            shutil.rmtree(target, ignore_errors=True)

    def delete(self) -> None:
        """Remove the chief's checkpoints once they are no longer needed (the next run starts afresh)."""
        if self.is_chief:
            shutil.rmtree(self.directory, ignore_errors=True)


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
    checkpoint_dir: Path | None = None,
    is_chief: bool = True,
) -> tuple[int, EpochCheckpoint | None]:
    """Train `model` (built under `strategy`) for `epochs`, reporting each epoch to `callbacks` as fit
    would; with `checkpoint_dir`, resume after the last checkpointed epoch and checkpoint every epoch.
    Returns how many training examples this worker itself processed, and the checkpoint (the caller
    deletes it once the model is safe)."""
    import tensorflow as tf

    with strategy.scope():
        optimizer = keras.optimizers.Adam(learning_rate)
        if mixed_precision:
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        optimizer.build(model.trainable_variables)
    checkpoint = EpochCheckpoint(checkpoint_dir, is_chief, model=model, optimizer=optimizer) if checkpoint_dir else None
    first_epoch = 0
    if checkpoint:
        first_epoch = checkpoint.restore()
        _check_same_epoch_everywhere(strategy, first_epoch)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    distributed = strategy.experimental_distribute_dataset(batches.train.with_options(options))
    step = _make_train_step(strategy, model, optimizer, global_batch, task)

    seen_here = 0
    for callback in callbacks:
        callback.set_model(model)
        callback.on_train_begin()
    for epoch in range(first_epoch, epochs):
        for callback in callbacks:
            callback.on_epoch_begin(epoch)
        totals = _train_one_epoch(strategy, step, distributed)
        seen_here += totals.seen_here
        if checkpoint:  # before anything reports the epoch done
            checkpoint.save(epoch + 1)
        validation = evaluate_locally(model, batches.validation, task) if batches.validation is not None else None
        logs = totals.logs(task, validation)
        log.info("epoch %d/%d: %s", epoch + 1, epochs, ", ".join(f"{k} {v:.4f}" for k, v in logs.items()))
        for callback in callbacks:
            callback.on_epoch_end(epoch, logs)
    for callback in callbacks:
        callback.on_train_end()
    return seen_here, checkpoint


def _check_same_epoch_everywhere(strategy, epoch: int) -> None:
    """Every worker must resume from the same epoch (the chief's checkpoint, read over the shared volume)."""
    import tensorflow as tf

    total = strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(epoch, tf.int64)), axis=None)
    if int(total) != epoch * strategy.num_replicas_in_sync:
        raise TrainserveError(
            f"this worker restored epoch {epoch} but the others did not: expected every worker to read the"
            " chief's checkpoint from one shared --backup-dir"
        )


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
