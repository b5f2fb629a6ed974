"""Train a Keras model on whatever accelerators are there, then publish a CPU-verified version.

data -> strategy/precision -> fit (tf.data, grad accumulation, backup/restore) -> float32 export ->
CPU gate (where no GPU is visible) -> warmup + metadata -> atomic numbered version -> run summary.
`train` reads as that sequence; each step is a function below or in a sibling module.
"""

from __future__ import annotations

import functools
import logging
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import keras
import numpy as np

from trainserve.data import Dataset
from trainserve.errors import TrainserveError
from trainserve.hashed_split import describe_split
from trainserve.image_splits import ImageHeldOutSplit
from trainserve.layout import UNKNOWN_CATEGORIES, version_files_sha256, write_warmup_requests
from trainserve.plots import plot_training_curves
from trainserve.sources import load_dataset
from trainserve.sources.image_folder import IMAGE_BYTES
from trainserve.splits import HeldOutSplit, provenance, write_version_record
from trainserve.training.builtin_models import default_architecture
from trainserve.training.callbacks import FitCallbacks, backup_dir_for, make_callbacks
from trainserve.training.config import TrainConfig
from trainserve.training.data_profile import write_data_profile
from trainserve.training.devices import DevicePlan, make_strategy
from trainserve.training.export import ExportJob, export_and_gate, serving_outputs
from trainserve.training.gate import FLOAT32_ATOL, MIXED_PRECISION_ATOL, GoldenBatch
from trainserve.training.images import ImagePipeline, model_inputs, serving_examples
from trainserve.training.model import build_for_training, fit_built
from trainserve.training.model_fn import DataSpec, data_spec, input_structure
from trainserve.training.multi_worker import (
    EpochCheckpoint,
    evaluate_locally,
    exit_when_a_worker_is_lost,
    fit_multi_worker,
    wait_for_all_workers,
    weights_digest,
)
from trainserve.training.pipeline import Batches, make_batches
from trainserve.training.preprocessing import counts_unknown_categories
from trainserve.training.publish import PublishedVersion, ensure_writable, publish_or_discard, staging_dir
from trainserve.training.run_records import version_metadata, write_run_summary
from trainserve.training.transfer import fit_frozen_then_fine_tuned, load_backbone_weights
from trainserve.training.warmup import captured_warmup, write_captured_warmup

log = logging.getLogger(__name__)

GOLDEN_BATCH = 32


@dataclass
class TrainResult:
    version: int | None  # None on workers other than 0: they do not publish
    version_dir: Path | None
    metrics: dict
    summary_path: Path


@dataclass
class Devices:
    """The strategy training runs under, what it runs on, and the global batch that follows."""

    strategy: Any  # tf.distribute.Strategy
    plan: DevicePlan
    global_batch: int  # per-replica batch x replicas (x K more per step with --grad-accum K)


@dataclass
class TrainingOutcome:
    """What fitting produced, beyond the model itself."""

    metrics: dict[str, float]  # on the held-out split: test_loss and test_accuracy, or test_loss and test_mae
    examples_seen: int | None  # by this worker; counted only by the multi-worker loop
    weights_sha256: str
    checkpoint: EpochCheckpoint | None = None  # the multi-worker loop's, deleted once the model is published


def train(config: TrainConfig) -> TrainResult:
    """Train, evaluate, export and publish one version; returns where it went."""
    config.check()
    started = time.time()
    dataset = _load_data(config)
    warmup = captured_warmup(config.warmup_from, config.model_name, dataset)  # checked before training
    keras.utils.set_random_seed(config.seed)
    devices = _set_up_devices(config)
    plan = devices.plan
    backup_dir = backup_dir_for(config, plan)
    # Held out per version: content-addressed, so a later training never overwrites what this version is judged on.
    split = _held_out_split(dataset, provenance(config.data, config.seed, config.test_fraction, dataset.hashed_split))
    if config.data_dir is not None and plan.is_chief:
        log.info("held-out split written to %s", split.share(config.data_dir, config.model_name))

    spec = data_spec(dataset.train, dataset.task, tabular=dataset.tabular, image=dataset.image)
    config = _with_architecture(config, spec)
    # Under multi-worker, a lost peer ends this worker too, with the exit code that restarts the group.
    with exit_when_a_worker_is_lost(plan.multi_worker):
        model = _build_model(config, spec, devices)
        structure = input_structure(model)
        images = ImagePipeline(dataset.image, config.augment, config.cache) if dataset.image else None
        batches = make_batches(
            dataset, devices.global_batch, config.grad_accum, config.seed, config.validation_split, structure, images
        )
        callbacks = make_callbacks(config, plan, backup_dir, batches.train_examples)
        outcome = _fit_and_evaluate(config, devices, model, batches, callbacks, spec, backup_dir)

        # Named once (the fingerprint hashes every array) for the run summary and the published metadata.
        data_info = {
            "source": config.data,
            "name": dataset.name,
            "fingerprint": dataset.fingerprint(),
            "test_split": split.record(shared=config.data_dir is not None),
        }
        data_info.update({"skipped": dataset.skipped} if dataset.skipped else {})  # image files left out
        published = (
            _export_and_publish(config, dataset, spec, data_info, model, plan, outcome.metrics, warmup)
            if plan.is_chief
            else None
        )
        if outcome.checkpoint is not None:  # kept until now: a failed export resumes after the last epoch
            outcome.checkpoint.delete()
        summary_path = write_run_summary(config, started, data_info, devices, callbacks, outcome, published)
        if callbacks.history_csv.is_file():
            plot_training_curves(callbacks.history_csv, callbacks.logs_dir / "training_curves.png")
        if plan.multi_worker:
            # No worker ends before the chief has published: one that exited 0 is not restarted, and a
            # group restart (the chief failing to publish) would wait for it forever.
            wait_for_all_workers(devices.strategy)
    log.info("logs in %s (history.csv, training_curves.png, tensorboard/, run_summary.json)", callbacks.logs_dir)
    version, version_dir = published if published else (None, None)
    return TrainResult(version, version_dir, outcome.metrics, summary_path)


def _load_data(config: TrainConfig) -> Dataset:
    """Load and describe the training data; also proves the export directory writable, before training."""
    dataset = load_dataset(
        config.data,
        config.synthetic,
        config.seed,
        config.label_column,
        config.test_fraction,
        config.categorical,
        config.image_format,
        config.skip_bad_images,
        config.held_out_split,
    )
    ensure_writable(config.export_base / config.model_name)  # fail now, not after training
    if len(dataset.y_train) == 0:
        raise TrainserveError(f"{config.data}: x_train is empty: expected training examples")
    task = dataset.task
    log.info(
        "data %s: %d train / %d test examples; inputs %s; %s",
        dataset.name,
        len(dataset.y_train),
        len(dataset.y_test),
        ", ".join(f"{k} {v.dtype.name}{list(v.shape[1:])}" for k, v in dataset.train.items()),
        f"classification, {task.classes} classes"
        if task.kind == "classification"
        else f"regression, {task.targets} target(s)",
    )
    if dataset.hashed_split:
        log.info("%s", describe_split(dataset.hashed_split))
    return dataset


def _set_up_devices(config: TrainConfig) -> Devices:
    """Pick the strategy and the precision, which becomes Keras' global dtype policy; log the batch sizes."""
    distribution = make_strategy(config.strategy, config.cpu_replicas, config.mixed_precision, config.heartbeat_timeout)
    plan = distribution.plan
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
    if plan.multi_worker and config.grad_accum > 1:
        raise TrainserveError("--grad-accum is not supported with multi-worker training: expected 1")
    return Devices(distribution.strategy, plan, global_batch)


def _held_out_split(dataset: Dataset, origin: dict) -> HeldOutSplit | ImageHeldOutSplit:
    """The test split as this version keeps it: arrays, or the image files themselves (eval sends their bytes)."""
    if dataset.image:
        return ImageHeldOutSplit(dataset.test[IMAGE_BYTES], dataset.y_test, list(dataset.label_names), origin)
    return HeldOutSplit(dataset.test, dataset.y_test, dataset.task, dataset.single, origin, dataset.test_digests)


def _build_model(config: TrainConfig, spec: DataSpec, devices: Devices) -> keras.Model:
    """The model its function builds under the strategy and dtype policy; compiled for Keras' fit unless
    the multi-worker loop trains it."""
    with devices.strategy.scope():
        model = build_for_training(
            config.model_reference,
            spec,
            config.learning_rate,
            config.grad_accum,
            compile=not devices.plan.multi_worker,
        )
    load_backbone_weights(model, config.architecture, config.weights)
    log.info("model %s from %s: %d parameters", model.name, config.model_reference, model.count_params())
    return model


def _with_architecture(config: TrainConfig, spec: DataSpec) -> TrainConfig:
    """`--architecture auto` resolved from the data (cnn for images, mlp for tables and arrays), logged."""
    if config.model_fn or config.architecture != "auto":
        return config
    chosen = default_architecture(spec)
    log.info("architecture %s, chosen for the data (--architecture overrides)", chosen)
    return replace(config, architecture=chosen)


def _fit_and_evaluate(
    config: TrainConfig,
    devices: Devices,
    model: keras.Model,
    batches: Batches,
    callbacks: FitCallbacks,
    spec: DataSpec,
    backup_dir: Path | None,
) -> TrainingOutcome:
    """Train for --epochs (per-epoch metrics on the validation split), then score the held-out test split
    with plain forward passes."""
    examples_seen, checkpoint = None, None
    if devices.plan.multi_worker:
        examples_seen, checkpoint = fit_multi_worker(
            devices.strategy,
            model,
            batches,
            epochs=config.epochs,
            global_batch=devices.global_batch,
            learning_rate=config.learning_rate,
            mixed_precision=devices.plan.mixed_precision,
            callbacks=[callbacks.history, callbacks.throughput],
            task=spec.task,
            checkpoint_dir=backup_dir,
            is_chief=devices.plan.is_chief,
        )
    else:
        fit = functools.partial(
            fit_built,
            model,
            batches.train,
            validation_data=batches.validation,
            callbacks=callbacks.for_fit(),
            shuffle=False,  # the tf.data pipeline already reshuffles every epoch
            verbose=1 if sys.stderr.isatty() else 2,
        )
        fine_tune_lr = config.fine_tune_learning_rate or config.learning_rate / 10
        fit_frozen_then_fine_tuned(model, fit, config.epochs, config.frozen_epochs, fine_tune_lr, callbacks.history)
    metrics = {f"test_{k}": v for k, v in evaluate_locally(model, batches.test, spec.task).items()}
    log.info("held-out %s", ", ".join(f"{k[5:]} {v:.4f}" for k, v in metrics.items()))
    return TrainingOutcome(
        metrics=metrics,
        examples_seen=examples_seen,
        weights_sha256=weights_digest(model),
        checkpoint=checkpoint,
    )


def _export_and_publish(
    config: TrainConfig,
    dataset: Dataset,
    spec: DataSpec,
    data_info: dict,
    model: keras.Model,
    plan: DevicePlan,
    metrics: dict,
    warmup: list[bytes] | None = None,
) -> PublishedVersion:
    """Export a float32 rebuild of `model`, check it on a CPU against `model`'s own outputs, then publish it."""
    golden = _golden_batch(model, serving_examples(dataset, GOLDEN_BATCH), spec)
    atol = MIXED_PRECISION_ATOL if plan.mixed_precision else FLOAT32_ATOL
    gate = {"atol": atol, "golden_batch": len(next(iter(golden.inputs.values())))}
    unknown = [UNKNOWN_CATEGORIES] if counts_unknown_categories(spec.preprocessing) else []  # the export's rule
    outputs = sorted([*golden.outputs, *unknown])
    metadata = version_metadata(config, dataset, data_info, plan, metrics, gate, outputs)
    # Always a fresh float32 rebuild, traced where no GPU is visible: no fp16 compute, no distributed
    # variables, no cuDNN kernel and no device placement from training in the served graph. In this process
    # when it has no GPU; a multi-worker process also has its cluster's devices, which a server will not.
    job = ExportJob(config.model_reference, spec, model.get_weights(), golden, atol)
    in_process = not plan.gpus and not plan.multi_worker
    prepare = functools.partial(
        _export_and_gate, job=job, in_process=in_process, model_name=config.model_name, warmup=warmup
    )
    published = publish_or_discard(
        staging_dir(config.export_base / config.model_name), prepare, metadata, config.retention
    )
    if config.data_dir is not None:  # eval finds the version's split here, without the models volume
        files = version_files_sha256(published.path)
        write_version_record(config.data_dir, config.model_name, published.version, metadata, files)
        write_data_profile(config.data_dir, config.model_name, published.version, dataset)  # for trainserve drift
    return published


def _golden_batch(model: keras.Model, inputs: dict[str, np.ndarray], spec: DataSpec) -> GoldenBatch:
    """The reference is the trained model itself, in the precision it trained in."""
    # A plain forward pass: predict() would distribute, and other workers may have finished already.
    pixels = model_inputs(inputs, spec.image)  # image bytes: decoded as the served graph decodes them
    outputs = serving_outputs(model(input_structure(model)(pixels), training=False), spec.task)
    return GoldenBatch(inputs, {k: np.asarray(v) for k, v in outputs.items()})


def _export_and_gate(
    path: Path, *, job: ExportJob, in_process: bool, model_name: str, warmup: list[bytes] | None = None
) -> None:
    """Fill the staged version directory and run the CPU gate on it; raises when either fails."""
    started = time.monotonic()
    gate = export_and_gate(job, path, in_process=in_process)
    if not gate.ok:
        raise TrainserveError(f"nothing published: {gate.reason}")
    if warmup:  # train --warmup-from: captured requests
        write_captured_warmup(path, warmup)
    else:
        write_warmup_requests(path, model_name, job.golden.inputs)  # the held-out examples the gate ran
    log.info(
        "CPU gate passed (export and gate %s, %.1f s): %s, max abs diff %.2e (<= %g)",
        "in this process: no GPU here" if in_process else "in a child process that sees no GPU",
        time.monotonic() - started,
        gate.checked,
        gate.max_abs_diff,
        job.atol,
    )
