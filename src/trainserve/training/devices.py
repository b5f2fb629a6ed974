"""Find the accelerators, pick a distribution strategy and a precision, and say what was picked.

Rather than train on whatever TensorFlow happens to see, the choice is explicit and logged:
no GPU -> CPU (one log line says so), one GPU -> OneDeviceStrategy, several -> MirroredStrategy,
TF_CONFIG set -> MultiWorkerMirroredStrategy (trained by `training.multi_worker`'s custom loop).
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from trainserve.errors import TrainserveError
from trainserve.training.cluster import ClusterTask, parse_tf_config
from trainserve.training.config import MIXED_PRECISION_MODES, STRATEGIES, MixedPrecision, Strategy

log = logging.getLogger(__name__)

MIXED_PRECISION_MIN_CAPABILITY = (7, 0)  # Volta and newer have tensor cores for float16


@dataclass
class DevicePlan:
    """What training runs on; recorded in the run summary and the published metadata.

    `mixed_precision` says whether float16 compute is on; `precision` names the Keras dtype policy that
    follows from it.
    """

    strategy: Strategy  # as resolved: never "auto"
    replicas: int
    devices: list[str]
    gpus: list[dict] = field(default_factory=list)
    mixed_precision: bool = False
    workers: int = 1
    worker_index: int = 0
    tensorflow: str = ""
    cuda: str = ""
    cudnn: str = ""

    @property
    def precision(self) -> str:
        """The Keras dtype policy training runs under."""
        return "mixed_float16" if self.mixed_precision else "float32"

    @property
    def multi_worker(self) -> bool:
        return self.strategy == "multi-worker"

    @property
    def is_chief(self) -> bool:
        """Worker 0 shares the data, writes the top-level logs and publishes; the others only train."""
        return self.worker_index == 0

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Distribution:
    """A tf.distribute strategy and the plan it carries out."""

    strategy: Any  # tf.distribute.Strategy; TensorFlow is imported only when training starts
    plan: DevicePlan


def configure_cpu_replicas(count: int) -> None:
    """Split the CPU into `count` logical devices so multi-replica code paths run without GPUs."""
    import tensorflow as tf

    if count > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)


def gpu_details() -> list[dict]:
    """Every visible GPU with its name and compute capability; enables memory growth on each."""
    import tensorflow as tf

    details = []
    for gpu in tf.config.list_physical_devices("GPU"):
        # Without growth TF grabs all GPU memory at start, starving anything else on the card.
        # RuntimeError: already initialised by an earlier call in this process.
        with contextlib.suppress(RuntimeError):
            tf.config.experimental.set_memory_growth(gpu, True)
        info = tf.config.experimental.get_device_details(gpu)
        details.append(
            {
                "name": gpu.name,
                "device_name": info.get("device_name", ""),
                "compute_capability": list(info.get("compute_capability") or ()),
            }
        )
    return details


def resolve_mixed_precision(mode: MixedPrecision, gpus: list[dict]) -> bool:
    """`auto` turns float16 on only when every GPU has tensor cores (compute capability >= 7.0)."""
    if mode == "on":
        return True
    if mode == "off":
        return False
    if mode != "auto":
        expected = f"{', '.join(MIXED_PRECISION_MODES[:-1])} or {MIXED_PRECISION_MODES[-1]}"
        raise TrainserveError(f"--mixed-precision {mode!r}: expected {expected}")
    return bool(gpus) and all(tuple(g["compute_capability"] or (0, 0)) >= MIXED_PRECISION_MIN_CAPABILITY for g in gpus)


def make_strategy(
    name: Strategy, cpu_replicas: int, mixed_precision: MixedPrecision, heartbeat_timeout: float | None = None
) -> Distribution:
    """Build the tf.distribute strategy `name` (`auto`: from TF_CONFIG and the devices) and log the plan;
    multi-worker: with `heartbeat_timeout` (seconds) for its coordination service, else TensorFlow's."""
    import tensorflow as tf

    configure_cpu_replicas(cpu_replicas)
    gpus = gpu_details()
    name = _pick_strategy(name, gpus, cpu_replicas)
    cluster = parse_tf_config(os.environ.get("TF_CONFIG", "")) if name == "multi-worker" else None
    if cluster and heartbeat_timeout:
        _configure_coordination(cluster, heartbeat_timeout)
    strategy = _build_strategy(name, gpus, cluster)
    build = tf.sysconfig.get_build_info()
    plan = DevicePlan(
        strategy=name,
        workers=len(cluster.workers) if cluster else 1,
        worker_index=cluster.index if cluster else 0,
        replicas=int(strategy.num_replicas_in_sync),
        devices=list(strategy.extended.worker_devices) if name != "default" else ["/cpu:0"],
        gpus=gpus,
        tensorflow=tf.__version__,
        cuda=str(build.get("cuda_version", "")),
        cudnn=str(build.get("cudnn_version", "")),
    )
    _log_plan(plan)
    plan.mixed_precision = resolve_mixed_precision(mixed_precision, gpus)
    return Distribution(strategy, plan)


def _pick_strategy(name: Strategy, gpus: list[dict], cpu_replicas: int) -> Strategy:
    if name == "auto":
        if os.environ.get("TF_CONFIG"):
            name = "multi-worker"
        elif len(gpus) > 1 or cpu_replicas > 1:
            name = "mirrored"
        elif gpus:
            name = "one-device"
        else:
            name = "default"
    if name not in STRATEGIES:
        raise TrainserveError(f"--strategy {name!r}: expected one of {', '.join(STRATEGIES)}")
    return name


def _configure_coordination(cluster: ClusterTask, heartbeat_timeout: float) -> None:
    """The coordination service MultiWorkerMirroredStrategy would start (it keeps one configured before it),
    with its own heartbeat timeout: how long a killed worker goes unnoticed by the others. TensorFlow has no
    public API for it; tests/test_multi_worker.py's killed-worker test runs with it set."""
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.python.eager import context

    context.context().configure_coordination_service(
        service_type="standalone",
        service_leader=f"/job:{cluster.task_type}/replica:0/task:0",
        coordinated_jobs=[
            coordination_config_pb2.CoordinatedJob(name=cluster.task_type, num_tasks=len(cluster.workers))
        ],
        heartbeat_timeout_in_ms=round(heartbeat_timeout * 1000),
    )
    log.info("multi-worker: a worker silent for %g s counts as lost", heartbeat_timeout)


def _build_strategy(name: Strategy, gpus: list[dict], cluster: ClusterTask | None):
    import tensorflow as tf

    if name == "one-device":
        return tf.distribute.OneDeviceStrategy("/gpu:0" if gpus else "/cpu:0")
    if name == "mirrored":
        if gpus:
            return tf.distribute.MirroredStrategy()
        cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(
            cpus, cross_device_ops=tf.distribute.ReductionToOneDevice(reduce_to_device=cpus[0])
        )
    if name == "multi-worker":
        log.info("multi-worker: worker %d of %d (%s)", cluster.index, len(cluster.workers), ", ".join(cluster.workers))
        return tf.distribute.MultiWorkerMirroredStrategy()
    return tf.distribute.get_strategy()


def _log_plan(plan: DevicePlan) -> None:
    if not plan.gpus:
        log.info("no GPU visible: training on the CPU (%d replica(s))", plan.replicas)
    log.info(
        "strategy %s, %d replica(s) on %s; TensorFlow %s, CUDA %s, cuDNN %s",
        plan.strategy,
        plan.replicas,
        ", ".join(plan.devices),
        plan.tensorflow,
        plan.cuda or "none",
        plan.cudnn or "none",
    )
    for gpu in plan.gpus:
        log.info("GPU %s: %s, compute capability %s", gpu["name"], gpu["device_name"], gpu["compute_capability"])
