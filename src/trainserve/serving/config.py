"""TF Serving's configuration files, parsed with their real schemas.

- `--model_config_file`: `ModelServerConfig` text proto, from the tensorflow-serving-api wheel
  (trainserve.model_server_config: rollout rewrites the same file, so its parser sits below both stages;
  re-exported here for serving's callers).
- `--batching_parameters_file`: `BatchingParameters` (servables/tensorflow/session_bundle_config.proto)
- `--monitoring_config_file`: `MonitoringConfig` (config/monitoring_config.proto)
The wheel ships no Python module for the last two, so their schemas (package, message and field
names, numbers and types as TF Serving declares them) are built here as descriptors; text_format then
accepts and rejects exactly what tensorflow_model_server would.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    wrappers_pb2,  # noqa: F401  (registers wrappers.proto in the default pool)
)
from google.protobuf import message_factory as _factory

from trainserve.errors import TrainserveError
from trainserve.model_server_config import (  # noqa: F401  (parse_model_config, single_model_config: re-exported)
    parse_model_config,
    parse_text_proto,
    single_model_config,
)

# tensorflow_model_server's flags (model_servers/main.cc). The stand-in and the static checks of
# compose and k8s manifests use this list: the real server silently ignores a misspelt flag.
TF_SERVING_FLAGS = frozenset(
    {
        "port",
        "grpc_socket_path",
        "rest_api_port",
        "rest_api_num_threads",
        "rest_api_timeout_in_ms",
        "rest_api_enable_cors_support",
        "enable_batching",
        "allow_version_labels_for_unavailable_models",
        "batching_parameters_file",
        "enable_per_model_batching_params",
        "model_config_file",
        "model_config_file_poll_wait_seconds",
        "model_name",
        "model_base_path",
        "max_num_load_retries",
        "load_retry_interval_micros",
        "file_system_poll_wait_seconds",
        "flush_filesystem_caches",
        "tensorflow_session_parallelism",
        "tensorflow_intra_op_parallelism",
        "tensorflow_inter_op_parallelism",
        "use_alts_credentials",
        "ssl_config_file",
        "platform_config_file",
        "per_process_gpu_memory_fraction",
        "saved_model_tags",
        "grpc_channel_arguments",
        "grpc_max_threads",
        "enable_model_warmup",
        "num_request_iterations_for_warmup",
        "version",
        "monitoring_config_file",
        "remove_unused_fields_from_bundle_metagraph",
        "prefer_tflite_model",
        "num_tflite_pools",
        "num_tflite_interpreters_per_pool",
        "enable_signature_method_name_check",
        "xla_cpu_compilation_enabled",
        "enable_profiler",
        "thread_pool_factory_config_file",
        "mixed_precision",
        "skip_initialize_tpu",
        "enable_grpc_healthcheck_service",
        "enable_serialization_as_tensor_content",
        "tfrt_runtime_enabled",
        "use_tflite_model",
    }
)


def _schema_pool() -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    wrappers = descriptor_pb2.FileDescriptorProto()
    wrappers_pb2.DESCRIPTOR.CopyToProto(wrappers)
    pool.Add(wrappers)
    f = descriptor_pb2.FieldDescriptorProto
    schema = descriptor_pb2.FileDescriptorProto(
        name="trainserve/tf_serving_schemas.proto",
        package="tensorflow.serving",
        syntax="proto3",
        dependency=["google/protobuf/wrappers.proto"],
    )

    def message(name: str, fields: list[tuple[str, int, int, str, bool]]) -> None:
        msg = schema.message_type.add(name=name)
        for field_name, number, kind, type_name, repeated in fields:
            field = msg.field.add(
                name=field_name, number=number, type=kind, label=f.LABEL_REPEATED if repeated else f.LABEL_OPTIONAL
            )
            if type_name:
                field.type_name = type_name

    i64, s = ".google.protobuf.Int64Value", ".google.protobuf.StringValue"
    message(
        "BatchingParameters",
        [
            ("max_batch_size", 1, f.TYPE_MESSAGE, i64, False),
            ("batch_timeout_micros", 2, f.TYPE_MESSAGE, i64, False),
            ("max_enqueued_batches", 3, f.TYPE_MESSAGE, i64, False),
            ("num_batch_threads", 4, f.TYPE_MESSAGE, i64, False),
            ("thread_pool_name", 5, f.TYPE_MESSAGE, s, False),
            ("allowed_batch_sizes", 6, f.TYPE_INT64, "", True),
            ("pad_variable_length_inputs", 7, f.TYPE_BOOL, "", False),
        ],
    )
    message("PrometheusConfig", [("enable", 1, f.TYPE_BOOL, "", False), ("path", 2, f.TYPE_STRING, "", False)])
    message(
        "MonitoringConfig",
        [("prometheus_config", 1, f.TYPE_MESSAGE, ".tensorflow.serving.PrometheusConfig", False)],
    )
    pool.Add(schema)
    return pool


_POOL = _schema_pool()
BatchingParametersProto = _factory.GetMessageClass(_POOL.FindMessageTypeByName("tensorflow.serving.BatchingParameters"))
MonitoringConfigProto = _factory.GetMessageClass(_POOL.FindMessageTypeByName("tensorflow.serving.MonitoringConfig"))
DEFAULT_PROMETHEUS_PATH = "/monitoring/prometheus/metrics"


@dataclass(frozen=True)
class Batching:
    """BatchingParameters as serve-local's batch scheduler uses them (defaults: TF Serving's;
    num_batch_threads 0 = one per CPU this process may use)."""

    max_batch_size: int = 1000
    batch_timeout_micros: int = 0
    num_batch_threads: int = 0
    max_enqueued_batches: int = 10
    allowed_batch_sizes: tuple[int, ...] = ()


def parse_batching(path: Path | None) -> Batching:
    """`--batching_parameters_file`, checked as TF Serving checks it."""
    if path is None:
        return Batching()
    params = parse_text_proto(path, BatchingParametersProto(), "batching parameters file")

    def value(name: str, default: int) -> int:
        return getattr(params, name).value if params.HasField(name) else default

    batching = Batching(
        max_batch_size=value("max_batch_size", Batching.max_batch_size),
        batch_timeout_micros=value("batch_timeout_micros", 0),
        num_batch_threads=value("num_batch_threads", 0),
        max_enqueued_batches=value("max_enqueued_batches", Batching.max_enqueued_batches),
        allowed_batch_sizes=tuple(params.allowed_batch_sizes),
    )
    sizes = batching.allowed_batch_sizes
    if batching.max_batch_size < 1 or batching.max_enqueued_batches < 1:
        raise TrainserveError(f"batching parameters file {path}: max_batch_size and max_enqueued_batches must be >= 1")
    if batching.batch_timeout_micros < 0 or batching.num_batch_threads < 0:
        raise TrainserveError(
            f"batching parameters file {path}: batch_timeout_micros and num_batch_threads must be >= 0"
        )
    if params.pad_variable_length_inputs:
        # Padding other dimensions changes the shapes callers get back; serve-local batches only requests
        # of equal shapes (others go to their own queue) rather than answer with padded outputs.
        raise TrainserveError(
            f"batching parameters file {path}: pad_variable_length_inputs is not supported by serve-local: "
            "expected it false (requests of different shapes are batched separately)"
        )
    if sizes and (list(sizes) != sorted(set(sizes)) or sizes[-1] != batching.max_batch_size):
        raise TrainserveError(
            f"batching parameters file {path}: allowed_batch_sizes {list(sizes)}: expected increasing sizes "
            f"ending with max_batch_size ({batching.max_batch_size})"
        )
    return batching


def parse_monitoring(path: Path | None) -> str | None:
    """The Prometheus path from `--monitoring_config_file`, or None when metrics are off."""
    if path is None:
        return None
    config = parse_text_proto(path, MonitoringConfigProto(), "monitoring config file")
    prometheus = config.prometheus_config
    if not prometheus.enable:
        return None
    return prometheus.path or DEFAULT_PROMETHEUS_PATH


@dataclass
class ServerOptions:
    """tensorflow_model_server's flags that serve-local implements (same names, same defaults)."""

    port: int = 8500
    rest_api_port: int = 0
    rest_api_timeout_in_ms: int = 30000
    rest_api_num_threads: int = 0
    grpc_max_threads: int = 0
    model_name: str = "default"
    model_base_path: str = ""
    model_config_file: str = ""
    model_config_file_poll_wait_seconds: int = 0
    file_system_poll_wait_seconds: int = 1
    enable_batching: bool = False
    batching_parameters_file: str = ""
    enable_model_warmup: bool = True
    monitoring_config_file: str = ""
    tensorflow_intra_op_parallelism: int = 0
    tensorflow_inter_op_parallelism: int = 0
    enable_grpc_healthcheck_service: bool = False
    allow_version_labels_for_unavailable_models: bool = False


def _bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r}: expected true or false")


FLAG_HELP = {
    "port": "gRPC port; 0 turns gRPC off",
    "rest_api_port": "REST port; 0 (default) turns REST off",
    "rest_api_timeout_in_ms": "grace for in-flight requests at shutdown",
    "rest_api_num_threads": "accepted for compatibility (REST uses a thread per connection)",
    "grpc_max_threads": "gRPC worker threads; 0 = 4 x CPUs",
    "model_name": "name of the single served model",
    "model_base_path": "its base path (WITHOUT the version directory)",
    "model_config_file": "ModelServerConfig text proto (overrides --model_name/--model_base_path)",
    "model_config_file_poll_wait_seconds": "re-read the config file this often; 0 = once",
    "file_system_poll_wait_seconds": "re-scan version directories this often",
    "enable_batching": "merge concurrent Predict requests into batches (BatchingParameters)",
    "batching_parameters_file": "BatchingParameters text proto; needs --enable_batching",
    "enable_model_warmup": "replay assets.extra/tf_serving_warmup_requests on load",
    "monitoring_config_file": "MonitoringConfig text proto: Prometheus metrics on the REST port",
    "tensorflow_intra_op_parallelism": "threads per op; 0 = all CPUs (set it from the CPU limit)",
    "tensorflow_inter_op_parallelism": "ops in parallel; 0 = all CPUs (set it from the CPU limit)",
    "enable_grpc_healthcheck_service": "grpc.health.v1 on --port: SERVING while every model has a version AVAILABLE",
    "allow_version_labels_for_unavailable_models": "a NEW label (or an unchanged one) may name a version not yet "
    "AVAILABLE; needed to start with labels in the config, since nothing is loaded when labels are first checked",
}


def add_serve_local_arguments(parser: argparse.ArgumentParser) -> None:
    """tensorflow_model_server's flag names; `--flag=value` and `--flag value` both work."""
    defaults = ServerOptions()
    for name, kind in ServerOptions.__annotations__.items():
        default = getattr(defaults, name)
        if kind == "bool":
            parser.add_argument(
                f"--{name}", type=_bool, nargs="?", const=True, default=default, metavar="BOOL", help=FLAG_HELP[name]
            )
        else:
            parser.add_argument(f"--{name}", type=int if kind == "int" else str, default=default, help=FLAG_HELP[name])


def options_from_args(args: argparse.Namespace) -> ServerOptions:
    return ServerOptions(**{k: getattr(args, k) for k in ServerOptions.__annotations__})
