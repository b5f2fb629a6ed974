"""The serving config file that rollout rewrites: read and checked with the real ModelServerConfig proto,
written atomically (temp file, fsync, rename) so that a polling server reads all of it or none, and
changed under an exclusive lock so that two rollout commands never interleave their read-modify-write.
"""

from __future__ import annotations

from pathlib import Path

from trainserve.errors import TrainserveError
from trainserve.files import write_file_atomic
from trainserve.model_server_config import parse_model_config, render_model_config, single_model_config

HEADER = (
    "# Written by trainserve (candidate, promote, rollback): the version policy and the labels move together,\n"
    "# so that a label never names a version the policy unloads. Change those with these commands; the history\n"
    "# of changes is in {history}.\n"
    "# To capture traffic under serve-local, add by hand in this model's config {{ ... }} (candidate, promote and\n"
    "# rollback keep it):\n"
    "#   logging_config {{ sampling_config {{ sampling_rate: 0.1 }}\n"
    '#                    log_collector_config {{ filename_prefix: "/captures/MODEL" }} }}\n'
    '# tensorflow_model_server rejects it ("No request-logger-creator provided"): capture in front of it with\n'
    "# `trainserve proxy` instead (docs/capture.md).\n"
)


def read_config(path: Path):
    """The ModelServerConfig in `path`; a missing or malformed file is a one-line error."""
    if not Path(path).is_file():
        raise TrainserveError(f"model config file {path} does not exist: expected the config serving polls")
    return parse_model_config(Path(path))


def new_config(model: str, base_path: str):
    """A config serving `model` from `base_path`, newest version, no labels (before any rollout)."""
    return single_model_config(model, base_path)


def find_model(config, path: Path, name: str | None):
    """The ModelConfig named `name` (or the only one when `name` is None)."""
    models = {m.name: m for m in config.model_config_list.config}
    if name is None:
        if len(models) != 1:
            raise TrainserveError(f"model config file {path} serves {sorted(models)}: expected --model naming one")
        return next(iter(models.values()))
    if name not in models:
        raise TrainserveError(f"model config file {path} has no model {name!r}: it serves {sorted(models)}")
    return models[name]


def history_path(path: Path) -> Path:
    """The append-only history of a config: beside it, named after it."""
    return Path(path).with_name(Path(path).name + ".history.jsonl")


def write_config(path: Path, config) -> None:
    """Replace `path` atomically with `config`: a polling server reads the old file or the new, never half."""
    text = HEADER.format(history=history_path(path).name) + render_model_config(config)
    write_file_atomic(Path(path), text.encode())
