"""TF_CONFIG for multi-worker training on plain Kubernetes (an Indexed Job plus a headless Service).

Each pod of an Indexed Job is `<job>-<index>`, gets JOB_COMPLETION_INDEX, and with `subdomain: <service>`
is resolvable as `<job>-<index>.<service>`. Every worker needs the same cluster list and its own index:

    export TF_CONFIG="$(trainserve tf-config)"   # from JOB_COMPLETION_INDEX and TRAINSERVE_* variables

A worker that loses a peer exits with `WorkerLost.exit_code`, which the Job's podFailurePolicy knows.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import NamedTuple

from trainserve.errors import TrainserveError

DEFAULT_PORT = 2222


class WorkerLost(TrainserveError):
    """Another worker of the group stopped (killed, preempted, restarted): this one cannot go on alone.

    Its own exit code (EX_TEMPFAIL), so that Kubernetes can tell it from a failure of this worker's own:
    the Job's podFailurePolicy replaces such a pod without counting it against the Job's backoffLimit.
    """

    exit_code = 75


class ClusterTask(NamedTuple):
    """This process's place in a TF_CONFIG cluster."""

    workers: list[str]  # every worker's host:port, in index order
    task_type: str
    index: int


def _int(env: Mapping[str, str], name: str, minimum: int) -> int:
    raw = env.get(name, "")
    try:
        value = int(raw)
    except ValueError:
        raise TrainserveError(f"{name}={raw!r}: expected an integer >= {minimum}") from None
    if value < minimum:
        raise TrainserveError(f"{name}={value}: expected an integer >= {minimum}")
    return value


def tf_config_from_env(env: Mapping[str, str] | None = None) -> dict:
    """Build TF_CONFIG from JOB_COMPLETION_INDEX, TRAINSERVE_WORKERS, TRAINSERVE_JOB_NAME,
    TRAINSERVE_SERVICE and optionally TRAINSERVE_NAMESPACE and TRAINSERVE_WORKER_PORT."""
    env = os.environ if env is None else env
    missing = [
        n
        for n in ("JOB_COMPLETION_INDEX", "TRAINSERVE_WORKERS", "TRAINSERVE_JOB_NAME", "TRAINSERVE_SERVICE")
        if not env.get(n)
    ]
    if missing:
        raise TrainserveError(f"cannot build TF_CONFIG: {', '.join(missing)} not set (expected an Indexed Job pod)")
    workers = _int(env, "TRAINSERVE_WORKERS", 1)
    index = _int(env, "JOB_COMPLETION_INDEX", 0)
    if index >= workers:
        raise TrainserveError(f"JOB_COMPLETION_INDEX={index}: expected < TRAINSERVE_WORKERS ({workers})")
    port = _int(env, "TRAINSERVE_WORKER_PORT", 1) if env.get("TRAINSERVE_WORKER_PORT") else DEFAULT_PORT
    if port > 65535:
        raise TrainserveError(f"TRAINSERVE_WORKER_PORT={port}: expected a port number <= 65535")
    domain = env["TRAINSERVE_SERVICE"] + (
        f".{env['TRAINSERVE_NAMESPACE']}.svc" if env.get("TRAINSERVE_NAMESPACE") else ""
    )
    job = env["TRAINSERVE_JOB_NAME"]
    return {
        "cluster": {"worker": [f"{job}-{i}.{domain}:{port}" for i in range(workers)]},
        "task": {"type": "worker", "index": index},
    }


def parse_tf_config(raw: str) -> ClusterTask:
    """The worker addresses, task type and task index in a TF_CONFIG string; clear errors when malformed."""
    try:
        config = json.loads(raw)
        workers = list(config["cluster"]["worker"])
        kind, index = str(config["task"]["type"]), int(config["task"]["index"])
    except (ValueError, KeyError, TypeError) as exc:
        raise TrainserveError(
            f"TF_CONFIG is not valid ({type(exc).__name__}: {exc}): expected "
            '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": i}}'
        ) from None
    if kind != "worker" or not 0 <= index < len(workers):
        raise TrainserveError(f"TF_CONFIG task {kind}/{index}: expected a worker index below {len(workers)}")
    return ClusterTask(workers, kind, index)
