"""Train a Keras model on whatever accelerators are there, then publish a CPU-verified version.

data -> strategy/precision -> fit (tf.data, grad accumulation, backup/restore) -> float32 export ->
warmup + metadata -> CPU gate in a separate process -> atomic numbered version.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import keras
import numpy as np

from trainserve.data import load_dataset, write_test_split
from trainserve.errors import TrainserveError
from trainserve.layout import DEFAULT_SIGNATURE, write_warmup_requests
from trainserve.plots import plot_training_curves
from trainserve.training.config import TrainConfig
from trainserve.training.devices import make_strategy, resolve_mixed_precision
from trainserve.training.export import export_savedmodel
from trainserve.training.gate import FLOAT32_ATOL, MIXED_PRECISION_ATOL, run_gate, save_golden
from trainserve.training.model import build_model, float32_copy
from trainserve.training.pipeline import make_input_pipeline, preprocess
from trainserve.training.publish import ensure_writable, publish_or_discard, staging_dir

log = logging.getLogger(__name__)

GOLDEN_BATCH = 32


@dataclass
class TrainResult:
    version: int
    version_dir: Path
    metrics: dict
    summary_path: Path


class ThroughputCallback(keras.callbacks.Callback):
    """Times each epoch, for the run summary's examples/s."""

    def __init__(self, examples: int):
        super().__init__()
        self.examples, self.seconds, self.epochs = examples, 0.0, 0

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds += time.perf_counter() - self._start
        self.epochs += 1

    @property
    def examples_per_second(self) -> float:
        return self.examples * self.epochs / self.seconds if self.seconds else 0.0


def train(config: TrainConfig) -> TrainResult:
    """Train, evaluate, export and publish one version; returns where it went."""
    config.check()
    started = time.time()
    dataset = load_dataset(config.data, config.synthetic, config.seed)
    ensure_writable(config.export_base / config.model_name)  # fail now, not after training
    if len(dataset.x_train) == 0:
        raise TrainserveError(f"{config.data}: x_train is empty: expected training examples")
    log.info(
        "data %s: %d train / %d test examples, images %s, %d classes",
        dataset.name,
        len(dataset.x_train),
        len(dataset.x_test),
        "x".join(map(str, dataset.input_shape)),
        dataset.num_classes,
    )

    keras.utils.set_random_seed(config.seed)
    strategy, plan = make_strategy(config.strategy, config.cpu_replicas)
    plan.mixed_precision = resolve_mixed_precision(config.mixed_precision, plan.gpus)
    keras.config.set_dtype_policy(plan.precision)
    log.info("precision: %s", plan.precision + (" (float32 softmax)" if plan.mixed_precision else ""))
    global_batch = config.batch_size * plan.replicas
    log.info(
        "global batch %d = %d per replica x %d replica(s)%s",
        global_batch,
        config.batch_size,
        plan.replicas,
        f"; gradients accumulated over {config.grad_accum} micro-batches of it per update"
        if config.grad_accum > 1
        else "",
    )

    multi_worker = plan.strategy == "multi-worker"
    chief = plan.worker_index == 0  # worker 0 shares data, writes the logs and publishes; the others only train
    if multi_worker and config.grad_accum > 1:
        raise TrainserveError("--grad-accum is not supported with multi-worker training: expected 1")
    backup_root = config.backup_dir
    if multi_worker and backup_root is not None:
        log.warning("--backup-dir is not used by multi-worker training: a preempted run restarts at epoch 1")
        backup_root = None
    if config.data_dir is not None and chief:
        shared = write_test_split(dataset, config.data_dir, config.model_name)
        log.info("held-out split written to %s", shared)

    # With accumulation each step takes K global batches and slices them inside the train step.
    step_batch = global_batch * config.grad_accum
    train_ds = make_input_pipeline(dataset.x_train, dataset.y_train, step_batch, config.seed, training=True)
    test_ds = make_input_pipeline(dataset.x_test, dataset.y_test, global_batch, config.seed, training=False)
    with strategy.scope():
        model = build_model(config.architecture, dataset.input_shape, dataset.num_classes, config.grad_accum)
        optimizer = keras.optimizers.Adam(config.learning_rate)
        if not multi_worker:
            model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        elif plan.mixed_precision:
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)

    logs_dir = config.logs_dir if chief else config.logs_dir / f"worker-{plan.worker_index}"
    logs_dir.mkdir(parents=True, exist_ok=True)
    history_csv = logs_dir / "history.csv"
    throughput = ThroughputCallback(len(dataset.x_train))
    # One subdirectory per model: Keras deletes its backup directory when training ends, and a volume's
    # mount point (or another model's backup) must survive that.
    backup_dir = backup_root / config.model_name if backup_root is not None else None
    resuming_from = _resume_epoch(backup_dir)
    csv_logger = keras.callbacks.CSVLogger(str(history_csv), append=bool(resuming_from))
    callbacks = []
    if backup_dir is not None:
        # First in the list: the backup of an epoch is on disk before anything reports that epoch done.
        callbacks.append(keras.callbacks.BackupAndRestore(str(backup_dir)))
        if resuming_from:
            log.info("resuming from epoch %d of %d (backup in %s)", resuming_from + 1, config.epochs, backup_dir)
    callbacks += [csv_logger, keras.callbacks.TensorBoard(str(logs_dir / "tensorboard"), write_graph=False), throughput]
    examples_seen = None
    if multi_worker:
        examples_seen = fit_multi_worker(
            strategy, model, optimizer, train_ds, test_ds, config.epochs, global_batch, [csv_logger, throughput]
        )
    else:
        model.fit(
            train_ds,
            validation_data=test_ds,
            epochs=config.epochs,
            callbacks=callbacks,
            shuffle=False,  # the tf.data pipeline already reshuffles every epoch
            verbose=1 if sys.stderr.isatty() else 2,
        )
    loss, accuracy = evaluate_locally(model, test_ds)
    metrics = {"test_loss": loss, "test_accuracy": accuracy}
    log.info("held-out accuracy %.4f, loss %.4f", accuracy, loss)

    # Named once (the fingerprint hashes every array) for the run summary and the published metadata.
    data_info = {"source": config.data, "name": dataset.name, "fingerprint": dataset.fingerprint()}
    version, version_dir = (
        _export_and_publish(config, dataset, data_info, model, plan, metrics) if chief else (None, None)
    )
    summary = {
        "model_name": config.model_name,
        "version": version,
        "version_dir": str(version_dir) if version_dir else None,
        "data": data_info,
        "devices": plan.as_dict(),
        "precision": plan.precision,
        "global_batch": global_batch,
        "grad_accum": config.grad_accum,
        "epochs": config.epochs,
        "resumed_from_epoch": resuming_from + 1 if resuming_from else None,
        "duration_s": round(time.time() - started, 3),
        "train_examples_per_s": round(throughput.examples_per_second, 1),
        "metrics": metrics,
        "weights_sha256": weights_digest(model),
        "examples_seen_by_this_worker": examples_seen,
        "config": json.loads(json.dumps(asdict(config), default=str)),
    }
    summary_path = logs_dir / "run_summary.json"
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    if history_csv.is_file():
        plot_training_curves(history_csv, logs_dir / "training_curves.png")
    log.info("logs in %s (history.csv, training_curves.png, tensorboard/, run_summary.json)", logs_dir)
    return TrainResult(version, version_dir, metrics, summary_path)


def weights_digest(model) -> str:
    """sha256 of every weight: equal across workers exactly when their models are identical."""
    digest = hashlib.sha256()
    for weight in model.get_weights():
        digest.update(np.ascontiguousarray(weight).tobytes())
    return digest.hexdigest()


def evaluate_locally(model, test_ds) -> tuple[float, float]:
    """Held-out loss and accuracy by plain forward passes (no collectives: safe on every worker)."""
    loss_sum, correct, count = 0.0, 0, 0
    for images, labels in test_ds:
        probabilities = np.asarray(model(images, training=False), np.float64)
        labels = labels.numpy()
        picked = np.clip(probabilities[np.arange(len(labels)), labels], 1e-7, 1.0)
        loss_sum += float(-np.log(picked).sum())
        correct += int((probabilities.argmax(axis=1) == labels).sum())
        count += len(labels)
    return loss_sum / count, correct / count


def fit_multi_worker(strategy, model, optimizer, train_ds, test_ds, epochs: int, global_batch: int, callbacks) -> int:
    """A custom loop for MultiWorkerMirroredStrategy, which Keras 3's fit does not support (keras#20585).

    Each global batch is split across all replicas of all workers; the optimizer all-reduces the
    gradients. Returns how many training examples this worker itself processed.
    """
    import tensorflow as tf

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    batches = strategy.experimental_distribute_dataset(train_ds.with_options(options))
    with strategy.scope():
        optimizer.build(model.trainable_variables)

    @tf.function
    def step(images, labels):
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

        return strategy.run(replica_step, args=(images, labels))

    total_op = tf.distribute.ReduceOp.SUM
    seen_here = 0
    for callback in callbacks:
        callback.set_model(model)
        callback.on_train_begin()
    for epoch in range(epochs):
        for callback in callbacks:
            callback.on_epoch_begin(epoch)
        loss_sum, hits, total, steps = 0.0, 0, 0, 0
        for images, labels in batches:
            loss, hit, count = step(images, labels)
            loss_sum += float(strategy.reduce(total_op, loss, axis=None))
            hits += int(strategy.reduce(total_op, hit, axis=None))
            total += int(strategy.reduce(total_op, count, axis=None))
            seen_here += sum(int(c) for c in strategy.experimental_local_results(count))
            steps += 1
        val_loss, val_accuracy = evaluate_locally(model, test_ds)
        logs = {"accuracy": hits / max(total, 1), "loss": loss_sum / max(steps, 1), "val_accuracy": val_accuracy,
                "val_loss": val_loss}  # fmt: skip
        log.info("epoch %d/%d: %s", epoch + 1, epochs, ", ".join(f"{k} {v:.4f}" for k, v in logs.items()))
        for callback in callbacks:
            callback.on_epoch_end(epoch, logs)
    for callback in callbacks:
        callback.on_train_end()
    return seen_here


def _resume_epoch(backup_dir: Path | None) -> int:
    """The epoch Keras' BackupAndRestore will resume at (0 when there is no backup)."""
    meta = backup_dir / "training_metadata.json" if backup_dir else None
    if meta is None or not meta.is_file():
        return 0
    try:
        return int(json.loads(meta.read_text())["epoch"])
    except (ValueError, KeyError, TypeError):
        raise TrainserveError(f"{meta} is unreadable: expected Keras BackupAndRestore metadata") from None


def _export_and_publish(config: TrainConfig, dataset, data_info: dict, model, plan, metrics: dict) -> tuple[int, Path]:
    golden_images = dataset.x_test[:GOLDEN_BATCH]
    # The reference is the trained model itself, in the precision it trained in.
    # A plain forward pass: predict() would distribute, and other workers may have finished already.
    probabilities = np.asarray(model(preprocess(golden_images), training=False), np.float32)
    expected = {"probabilities": probabilities, "classes": probabilities.argmax(axis=-1).astype(np.int64)}
    # Always a fresh float32 copy built outside any strategy: no fp16 compute, no distributed variables,
    # no device placement from training in the served graph.
    export_model = float32_copy(model, config.architecture)
    atol = MIXED_PRECISION_ATOL if plan.mixed_precision else FLOAT32_ATOL

    model_base = config.export_base / config.model_name
    metadata = {
        "model_name": config.model_name,
        "tensorflow": plan.tensorflow,
        "trained_on": {
            "strategy": plan.strategy,
            "replicas": plan.replicas,
            "devices": plan.devices,
            "gpus": [g["device_name"] for g in plan.gpus],
            "precision": plan.precision,
        },
        "exported_precision": "float32",
        "data": data_info,
        "label_names": dataset.label_names,
        "input_shape": list(dataset.input_shape),
        "signature": {"name": DEFAULT_SIGNATURE, "input": "images", "outputs": ["probabilities", "classes"]},
        "metrics": metrics,
        "gate": {"atol": atol, "golden_batch": len(golden_images)},
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }

    def build_and_check(path: Path) -> None:
        export_savedmodel(export_model, path, dataset.input_shape)
        write_warmup_requests(path, config.model_name, {"images": dataset.x_test})
        with tempfile.TemporaryDirectory() as tmp:
            golden = save_golden(Path(tmp) / "golden.npz", {"images": golden_images}, expected)
            gate = run_gate(path, golden, atol)
        if not gate.ok:
            raise TrainserveError(f"CPU gate failed, nothing published: {gate.reason}")
        log.info("CPU gate passed: %s, max abs diff %.2e (<= %g)", gate.checked, gate.max_abs_diff, atol)

    return publish_or_discard(staging_dir(model_base), build_and_check, metadata, config.keep)
