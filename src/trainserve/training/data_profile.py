"""The training data's profile (trainserve.data_profile) written beside the version's record, where `trainserve
drift` reads it: `<data_dir>/<model>/versions/<version>.profile.json`."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from trainserve.data import Dataset
from trainserve.data_profile import profile_inputs, profile_path
from trainserve.files import write_file_atomic

log = logging.getLogger(__name__)


def write_data_profile(data_dir: Path, model: str, version: int, dataset: Dataset) -> Path | None:
    """Profile the training split's inputs (image folders, whose inputs are file paths, are not profiled yet)."""
    if dataset.image is not None:
        log.info("data profile: image folders are not profiled (no drift statistics for this version)")
        return None
    profile = profile_inputs(dataset.train) | {"model": model, "version": version, "examples": len(dataset.y_train)}
    path = write_file_atomic(profile_path(data_dir, model, version), (json.dumps(profile) + "\n").encode())
    log.info("data profile of %d features written to %s", len(profile["features"]), path)
    return path
