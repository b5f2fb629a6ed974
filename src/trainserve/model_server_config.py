"""TF Serving's `--model_config_file`: a `ModelServerConfig` text proto, read and written with TF Serving's
own message (trainserve.protos.model_server_config_pb2: no TensorFlow, no serving wheel).

Serving (serve-local) reads it; rollout rewrites its version policy and labels. Both accept and reject
exactly what tensorflow_model_server would, with one-line errors naming the file and the line.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format

from trainserve.errors import TrainserveError
from trainserve.protos import model_server_config_pb2


def parse_text_proto(path: Path, message, what: str):
    """Parse a text-format proto file; errors name the file, the line and what was expected."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise TrainserveError(f"{what} {path} cannot be read ({exc.strerror}): expected a text proto file") from None
    try:
        return text_format.Parse(text, message)
    except text_format.ParseError as exc:
        # ParseError's text is "LINE:COLUMN : message".
        raise TrainserveError(f"{what} {path}: line {exc} (expected a {message.DESCRIPTOR.name} text proto)") from None


def parse_model_config(path: Path):
    """`--model_config_file`: a ModelServerConfig with a model_config_list of tensorflow models."""
    config = parse_text_proto(path, model_server_config_pb2.ModelServerConfig(), "model config file")
    if config.WhichOneof("config") != "model_config_list":
        raise TrainserveError(f"model config file {path}: expected a model_config_list (custom configs unsupported)")
    names = set()
    for model in config.model_config_list.config:
        if not model.name or not model.base_path:
            raise TrainserveError(f"model config file {path}: every config needs a name and a base_path")
        if model.name in names:
            raise TrainserveError(f"model config file {path}: model {model.name!r} is configured twice")
        if model.model_platform not in ("", "tensorflow"):
            raise TrainserveError(
                f"model config file {path}: model {model.name!r} has platform {model.model_platform!r}: "
                "expected tensorflow"
            )
        for label in model.version_labels:
            if not label or not all(c.isalnum() or c == "_" for c in label):
                raise TrainserveError(f"model config file {path}: version label {label!r}: expected [a-zA-Z0-9_]+")
        names.add(model.name)
    return config


def single_model_config(name: str, base_path: str):
    """What `--model_name/--model_base_path` mean: one model, latest version."""
    config = model_server_config_pb2.ModelServerConfig()
    config.model_config_list.config.add(name=name, base_path=base_path, model_platform="tensorflow")
    return config


def render_model_config(config) -> str:
    """The text proto of a ModelServerConfig, as written to `--model_config_file`."""
    return text_format.MessageToString(config)
