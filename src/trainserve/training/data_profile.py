"""The training data's profile (trainserve.data_profile) written beside the version's record, where `trainserve
drift` reads it: `<data_dir>/<model>/versions/<version>.profile.json`."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from trainserve.data import Dataset
from trainserve.data_profile import profile_inputs, profile_path
from trainserve.files import write_file_atomic

log = logging.getLogger(__name__)


MAX_IMAGE_FILES = 2000  # an image folder's profile reads an evenly spaced sample of this many files


def _file_bytes(paths: np.ndarray) -> np.ndarray:
    step = max(1, len(paths) // MAX_IMAGE_FILES)
    return np.array([Path(p).read_bytes() for p in paths[::step]], dtype=object)


def write_data_profile(data_dir: Path, model: str, version: int, dataset: Dataset) -> Path | None:
    """Profile the training split's inputs (an image folder's: a sample of its files' bytes)."""
    inputs = dataset.train
    if dataset.image is not None:  # the input holds the files' paths: profile their bytes, as clients send them
        inputs = {name: _file_bytes(paths) for name, paths in inputs.items()}
    profile = profile_inputs(inputs) | {"model": model, "version": version, "examples": len(dataset.y_train)}
    path = write_file_atomic(profile_path(data_dir, model, version), (json.dumps(profile) + "\n").encode())
    log.info("data profile of %d features written to %s", len(profile["features"]), path)
    return path
