"""What training reports to, and how a killed run resumes.

Each worker writes its own logs directory: history.csv, TensorBoard events and the examples/s meter's
numbers. With --backup-dir, every finished epoch is saved (Keras' BackupAndRestore; under multi-worker,
the custom loop's own checkpoint, `multi_worker.EpochCheckpoint`), and a rerun of the same command
resumes after the last one.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import keras

from trainserve.errors import TrainserveError
from trainserve.training.config import TrainConfig
from trainserve.training.devices import DevicePlan

log = logging.getLogger(__name__)


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


@dataclass
class FitCallbacks:
    """One worker's callbacks, the directory they write to, and where a backup resumes."""

    logs_dir: Path
    history: keras.callbacks.CSVLogger
    tensorboard: keras.callbacks.TensorBoard
    throughput: ThroughputCallback
    backup: keras.callbacks.BackupAndRestore | None = None  # fit's; the multi-worker loop checkpoints itself
    resuming_from: int = 0  # epochs already finished by the run a backup resumes (0: a fresh start)

    @property
    def history_csv(self) -> Path:
        return self.logs_dir / "history.csv"

    def for_fit(self) -> list[keras.callbacks.Callback]:
        # Backup first: the backup of an epoch is on disk before anything reports that epoch done.
        first = [self.backup] if self.backup is not None else []
        return [*first, self.history, self.tensorboard, self.throughput]


def backup_dir_for(config: TrainConfig, plan: DevicePlan) -> Path | None:
    """Where this model's backup lives; None without --backup-dir. Under multi-worker, the chief's
    checkpoint, which every worker restores: --backup-dir must be one volume that all of them reach."""
    if config.backup_dir is None:
        if plan.multi_worker:
            log.warning("no --backup-dir: a group that loses a worker restarts at epoch 1")
        return None
    # One subdirectory per model: the backup is deleted when it is no longer needed, and a volume's
    # mount point (or another model's backup) must survive that.
    return config.backup_dir / config.model_name


def make_callbacks(config: TrainConfig, plan: DevicePlan, backup_dir: Path | None, train_examples: int) -> FitCallbacks:
    """Create this worker's logs directory (worker 0's is --logs-dir itself) and the callbacks writing there."""
    logs_dir = config.logs_dir if plan.is_chief else config.logs_dir / f"worker-{plan.worker_index}"
    logs_dir.mkdir(parents=True, exist_ok=True)
    throughput = ThroughputCallback(train_examples)
    if plan.multi_worker:
        from trainserve.training.multi_worker import checkpointed_epochs

        resuming_from = checkpointed_epochs(backup_dir)
    else:
        resuming_from = resume_epoch(backup_dir)
    history = keras.callbacks.CSVLogger(str(logs_dir / "history.csv"), append=bool(resuming_from))
    backup = None
    if backup_dir is not None and not plan.multi_worker:
        backup = keras.callbacks.BackupAndRestore(str(backup_dir))
    if resuming_from:
        log.info("resuming from epoch %d of %d (backup in %s)", resuming_from + 1, config.epochs, backup_dir)
    tensorboard = keras.callbacks.TensorBoard(str(logs_dir / "tensorboard"), write_graph=False)
    return FitCallbacks(logs_dir, history, tensorboard, throughput, backup, resuming_from)


def resume_epoch(backup_dir: Path | None) -> int:
    """The epoch Keras' BackupAndRestore will resume at (0 when there is no backup)."""
    meta = backup_dir / "training_metadata.json" if backup_dir else None
    if meta is None or not meta.is_file():
        return 0
    try:
        return int(json.loads(meta.read_text())["epoch"])
    except (ValueError, KeyError, TypeError):
        raise TrainserveError(f"{meta} is unreadable: expected Keras BackupAndRestore metadata") from None
