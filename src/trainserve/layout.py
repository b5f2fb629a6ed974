"""Where the stages meet on disk: the model directory (what training writes and serving and evaluation
read) and the held-out split training shares with the eval client.

    <base>/<model>/<version>/saved_model.pb, variables/, assets/
    <base>/<model>/<version>/assets.extra/tf_serving_warmup_requests   PredictionLog records (TF Serving's)
    <base>/<model>/<version>/assets.extra/trainserve.json              what trainserve knows of the version
    <base>/<model>/.tmp-<host>-<pid>-<id>/                             a version being staged

A version is a child directory whose name is an integer, exactly as TF Serving's file-system source
decides (sources/storage_path/file_system_storage_path_source.cc); any other name is skipped, which is
what makes staging in `.tmp-*` and one rename an atomic publish. Nothing else defines these names.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from trainserve.protos import prediction_log_pb2
from trainserve.task import Task
from trainserve.tensors import from_tensor_proto, to_tensor_proto

DEFAULT_SIGNATURE = "serving_default"
ASSETS_EXTRA = "assets.extra"
WARMUP_FILE = "tf_serving_warmup_requests"
METADATA_FILE = "trainserve.json"
MAX_WARMUP_RECORDS = 1000  # TF Serving replays at most this many (servables/tensorflow/saved_model_warmup)
STAGING_PREFIX = ".tmp-"

# Output names of the serving signature trainserve exports, by task.
PROBABILITIES, CLASSES, PREDICTIONS = "probabilities", "classes", "predictions"
# Classes with names (not just ids) also give the predicted class's name [N] and every column's name [N, K]
# (as TensorFlow's classification signature does); tabular models with categories count unseen ones [N].
CLASS_NAMES, LABEL_NAMES, UNKNOWN_CATEGORIES = "class_names", "label_names", "unknown_categories"

# The held-out split training shares with the eval client (`<data_dir>/<model>/test.npz`) carries the task
# too, as JSON in a 0-d string array under this key: the client sees only gRPC and that file, never the
# server's disk.
SPLIT_TASK_KEY = "task"


def is_version_dir(path: Path) -> bool:
    # ASCII digits only: str.isdigit() also takes '²' (int() then fails) and '١٢' (which TF Serving skips).
    return path.name.isascii() and path.name.isdigit() and path.is_dir()


def numeric_versions(model_base: Path) -> list[int]:
    """Version numbers present under `model_base`, as TF Serving sees them (integer dir names)."""
    if not model_base.is_dir():
        return []
    return sorted(int(p.name) for p in model_base.iterdir() if is_version_dir(p))


def warmup_path(version_dir: Path) -> Path:
    return Path(version_dir) / ASSETS_EXTRA / WARMUP_FILE


def metadata_path(version_dir: Path) -> Path:
    return Path(version_dir) / ASSETS_EXTRA / METADATA_FILE


def write_metadata(version_dir: Path, metadata: dict) -> None:
    path = metadata_path(version_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(metadata, indent=2, sort_keys=True) + "\n")


def read_metadata(version_dir: Path) -> dict | None:
    """`trainserve.json` of a version, or None for a SavedModel trainserve did not publish."""
    path = metadata_path(version_dir)
    return json.loads(path.read_text()) if path.is_file() else None


def read_task(version_dir: Path) -> Task | None:
    """The task recorded in `trainserve.json`, or None (a SavedModel not made by trainserve, or an older one)."""
    metadata = read_metadata(version_dir)
    return Task.from_json(metadata["task"]) if metadata and "task" in metadata else None


def write_warmup_requests(
    version_dir: Path, model_name: str, inputs: dict[str, np.ndarray], batch_sizes=(1, 8, 32)
) -> int:
    """`assets.extra/tf_serving_warmup_requests`: real held-out examples as PredictionLog records.

    One record per batch size the server is likely to see, so the first real requests after a load
    are not the slow ones (tensorflow/serving#385).
    """
    import tensorflow as tf

    path = warmup_path(version_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with tf.io.TFRecordWriter(str(path)) as writer:
        for size in batch_sizes[:MAX_WARMUP_RECORDS]:
            log = prediction_log_pb2.PredictionLog()
            request = log.predict_log.request
            request.model_spec.name, request.model_spec.signature_name = model_name, DEFAULT_SIGNATURE
            for key, array in inputs.items():
                to_tensor_proto(array[: min(size, len(array))], into=request.inputs[key])
            writer.write(log.SerializeToString())
            count += 1
    return count


def read_warmup_inputs(version_dir: Path) -> list[tuple[str, dict[str, np.ndarray]]]:
    """The (signature, inputs) of each warmup PredictionLog record, as TF Serving replays them."""
    import tensorflow as tf  # for its TFRecord reader

    path = warmup_path(version_dir)
    if not path.is_file():
        return []
    requests = []
    for raw in tf.data.TFRecordDataset(str(path)).take(MAX_WARMUP_RECORDS):
        log = prediction_log_pb2.PredictionLog.FromString(raw.numpy())
        request = log.predict_log.request
        inputs = {k: from_tensor_proto(v) for k, v in request.inputs.items()}
        requests.append((request.model_spec.signature_name or DEFAULT_SIGNATURE, inputs))
    return requests


# The shared held-out split (`<data_dir>/<model>/test.npz`): one input as `x_test`, several as
# `x_test/<input>`; labels `y_test`; `label_names` (classification); the Task as JSON under SPLIT_TASK_KEY.
SPLIT_INPUTS, SPLIT_LABELS, SPLIT_LABEL_NAMES = "x_test", "y_test", "label_names"


def split_arrays(inputs: dict[str, np.ndarray], labels: np.ndarray, task: Task, single: bool) -> dict[str, np.ndarray]:
    """The arrays of a shared split: `x_test` when `single` (one input), else `x_test/<input>` each."""
    if single and len(inputs) != 1:
        raise ValueError(f"a single-input split needs exactly one input, got {sorted(inputs)}")
    # C order always: the eval client streams rows straight from the file.
    arrays = {SPLIT_INPUTS: np.ascontiguousarray(next(iter(inputs.values())))} if single else {}
    if not single:
        arrays.update({f"{SPLIT_INPUTS}/{name}": np.ascontiguousarray(array) for name, array in inputs.items()})
    arrays[SPLIT_LABELS] = np.ascontiguousarray(labels)
    arrays[SPLIT_LABEL_NAMES] = np.array(list(task.label_names), dtype=str)
    arrays[SPLIT_TASK_KEY] = np.array(json.dumps(task.to_json()))
    return arrays


def split_task(npz) -> Task | None:
    """The Task a shared split carries (a mapping of arrays, e.g. an open np.load), or None (older files)."""
    if SPLIT_TASK_KEY not in getattr(npz, "files", npz):
        return None
    return Task.from_json(json.loads(str(npz[SPLIT_TASK_KEY][()])))


def split_input_names(files) -> list[str]:
    """Input names of a shared split's `x_test/<input>` keys; [] when it holds one `x_test`."""
    prefix = SPLIT_INPUTS + "/"
    return sorted(f[len(prefix) :] for f in files if f.startswith(prefix))


# What identifies a published version's files: the graph, TF's own fingerprint, the variables' index (it holds
# each tensor's checksum, so the data shards need not be read) and trainserve's record of the version.
FINGERPRINTED_FILES = (
    "saved_model.pb",
    "fingerprint.pb",
    "variables/variables.index",
    f"{ASSETS_EXTRA}/{METADATA_FILE}",
)


def version_files_sha256(version_dir: Path) -> str:
    """SHA-256 over the files that identify a version (each name, then its bytes; absent files named absent).

    A version deleted and published again under the same number (the next number is max + 1) has other
    files, so an eval report of the old one does not vouch for the new one."""
    import hashlib

    digest = hashlib.sha256()
    for name in FINGERPRINTED_FILES:
        path = Path(version_dir) / name
        digest.update(name.encode() + b"\0")
        digest.update(path.read_bytes() if path.is_file() else b"<absent>")
        digest.update(b"\0")
    return digest.hexdigest()
