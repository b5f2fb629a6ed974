"""TF Serving's configuration files, parsed with their real schemas.

- `--model_config_file`: `ModelServerConfig` text proto (trainserve.model_server_config: rollout rewrites
  the same file, so its parser sits below both stages; re-exported here for serving's callers).
- `--batching_parameters_file`: `BatchingParameters` (servables/tensorflow/session_bundle_config.proto)
- `--monitoring_config_file`: `MonitoringConfig` (config/monitoring_config.proto)
- `--ssl_config_file`: `SSLConfig` (config/ssl_config.proto), read and checked in serving/tls.py
All four are TF Serving's own messages from trainserve.protos, so text_format accepts and rejects
exactly what tensorflow_model_server would. `ServerOptions` are its flags, declared with options.py
(flag names as the real server spells them: `--model_base_path`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainserve.errors import TrainserveError
from trainserve.model_server_config import (  # noqa: F401  (parse_model_config, single_model_config: re-exported)
    parse_model_config,
    parse_text_proto,
    single_model_config,
)
from trainserve.options import option, parse_bool
from trainserve.protos import monitoring_config_pb2, session_bundle_config_pb2
from trainserve.traffic.writer import WriterLimits

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
    params = parse_text_proto(path, session_bundle_config_pb2.BatchingParameters(), "batching parameters file")

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
    config = parse_text_proto(path, monitoring_config_pb2.MonitoringConfig(), "monitoring config file")
    prometheus = config.prometheus_config
    if not prometheus.enable:
        return None
    return prometheus.path or DEFAULT_PROMETHEUS_PATH


@dataclass
class ServerOptions:
    """tensorflow_model_server's flags that serve-local implements (same names, same defaults)."""

    port: int = option(8500, "gRPC port; 0 turns gRPC off")
    rest_api_port: int = option(0, "REST port; 0 (default) turns REST off")
    rest_api_timeout_in_ms: int = option(30000, "grace for in-flight requests at shutdown")
    rest_api_num_threads: int = option(0, "accepted for compatibility (REST uses a thread per connection)")
    grpc_max_threads: int = option(0, "threads running the requests that join no batch; 0 = 4 x CPUs")
    model_name: str = option("default", "name of the single served model")
    model_base_path: str = option("", "its base path (WITHOUT the version directory)")
    model_config_file: str = option("", "ModelServerConfig text proto (overrides --model_name/--model_base_path)")
    model_config_file_poll_wait_seconds: int = option(0, "re-read the config file this often; 0 = once")
    file_system_poll_wait_seconds: int = option(1, "re-scan version directories this often")
    enable_batching: bool = option(
        False, "merge concurrent Predict requests into batches (BatchingParameters)", parse=parse_bool
    )
    batching_parameters_file: str = option("", "BatchingParameters text proto; needs --enable_batching")
    enable_model_warmup: bool = option(True, "replay assets.extra/tf_serving_warmup_requests on load", parse=parse_bool)
    monitoring_config_file: str = option("", "MonitoringConfig text proto: Prometheus metrics on the REST port")
    ssl_config_file: str = option(
        "", "SSLConfig text proto (PEM contents): gRPC over TLS; client_verify requires client certificates"
    )
    tensorflow_intra_op_parallelism: int = option(0, "threads per op; 0 = all CPUs (set it from the CPU limit)")
    tensorflow_inter_op_parallelism: int = option(0, "ops in parallel; 0 = all CPUs (set it from the CPU limit)")
    enable_grpc_healthcheck_service: bool = option(
        False, "grpc.health.v1 on --port: SERVING while every model has a version AVAILABLE", parse=parse_bool
    )
    # serve-local's own (tensorflow_model_server logs no requests): bounds of what logging_config writes.
    capture: WriterLimits = option(factory=WriterLimits)
    allow_version_labels_for_unavailable_models: bool = option(
        False,
        "a NEW label (or an unchanged one) may name a version not yet AVAILABLE; needed to start with labels in "
        "the config, since nothing is loaded when labels are first checked",
        parse=parse_bool,
    )
