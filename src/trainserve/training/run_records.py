"""What a run writes about itself: the new version's `trainserve.json` and the worker's run_summary.json."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from trainserve.data import Dataset
from trainserve.layout import DEFAULT_SIGNATURE
from trainserve.training.config import TrainConfig
from trainserve.training.devices import DevicePlan
from trainserve.training.model_fn import dtype_name

if TYPE_CHECKING:
    from trainserve.training.callbacks import FitCallbacks
    from trainserve.training.publish import PublishedVersion


def version_metadata(
    config: TrainConfig,
    dataset: Dataset,
    data_info: dict,
    plan: DevicePlan,
    metrics: dict,
    gate: dict,
    outputs: list[str],
) -> dict:
    """assets.extra/trainserve.json of the new version (publishing adds its number)."""
    return {
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
        "model_fn": config.model_reference,
        "task": dataset.task.to_json(),
        "label_names": dataset.label_names,
        "inputs": [{"name": k, "dtype": dtype_name(v), "shape": list(v.shape[1:])} for k, v in dataset.test.items()],
        **({"input_shape": list(dataset.input_shape)} if len(dataset.test) == 1 else {}),
        **({"image": dataset.image.to_json()} if dataset.image else {}),
        "signature": {
            "name": DEFAULT_SIGNATURE,
            "inputs": list(dataset.test),
            "outputs": outputs,
        },
        "metrics": metrics,
        "gate": gate,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_run_summary(
    config: TrainConfig,
    started: float,
    data_info: dict,
    devices,  # run.Devices
    callbacks: FitCallbacks,
    outcome,  # run.TrainingOutcome
    published: PublishedVersion | None,
) -> Path:
    """Write this worker's run_summary.json; returns its path."""
    summary = {
        "model_name": config.model_name,
        "version": published.version if published else None,
        "version_dir": str(published.path) if published else None,
        "data": data_info,
        "devices": devices.plan.as_dict(),
        "precision": devices.plan.precision,
        "global_batch": devices.global_batch,
        "grad_accum": config.grad_accum,
        "epochs": config.epochs,
        "resumed_from_epoch": callbacks.resuming_from + 1 if callbacks.resuming_from else None,
        "duration_s": round(time.time() - started, 3),
        "train_examples_per_s": round(callbacks.throughput.examples_per_second, 1),
        "metrics": outcome.metrics,
        "weights_sha256": outcome.weights_sha256,
        "examples_seen_by_this_worker": outcome.examples_seen,
        "config": json.loads(json.dumps(asdict(config), default=str)),
    }
    summary_path = callbacks.logs_dir / "run_summary.json"
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    return summary_path
