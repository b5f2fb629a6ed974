"""What a rollout must hold before its START record is written, judged with nothing moved: the version and the
labels, the model's route, the offline evidence promote would check, the proxy's replicas under one scrape job,
and the plan (`auto`: sized to the traffic); then the START record's fields.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import asdict, dataclass

from trainserve.errors import TrainserveError
from trainserve.proxy.routing import default_sticky_salt
from trainserve.rollout import moves
from trainserve.rollout.bake_size import bake_of
from trainserve.rollout.labels import Rollout
from trainserve.rollout.offline import evidence_of, offline_summary
from trainserve.rollout.plan import Plan
from trainserve.rollout.prometheus import Prometheus, PrometheusUnreachable
from trainserve.rollout.rollout_config import RolloutConfig
from trainserve.rollout.sizing.auto import resolve
from trainserve.rollout.targets import refuse_unjudged_replicas

log = logging.getLogger("trainserve.rollout.controller")


@dataclass(frozen=True)
class Begun:
    """A rollout that may start: its version, its plan, and the START record's fields."""

    version: int
    plan: Plan
    fields: dict


def candidate_of(config: RolloutConfig, labels: Rollout, model: str) -> int:
    """--candidate, or else the version the config labels `candidate` (staged by `trainserve candidate`)."""
    if config.candidate is not None:
        return config.candidate
    if labels.candidate is None:
        raise TrainserveError(f"model {model} has no `candidate` label: expected --candidate VERSION")
    return labels.candidate


def may_begin(
    config: RolloutConfig, prometheus: Prometheus | None, model: str, labels: Rollout, staging: bool, now: float
) -> Begun:
    """Every refusal a rollout of `model` can meet before anything moves (`staging`: the controller can load and
    label a version that is not the candidate yet), then its plan and its START record's fields."""
    version = candidate_of(config, labels, model)
    _refuse_labels(model, version, labels, staging)
    current = moves.route_of(config.routing_file, model)
    moves.refuse_a_share(config.routing_file, model, current, "a rollout with none of it in the history")
    read = evidence_of(config, model, labels, version)
    # Before the START record, so that a refusal leaves nothing to --abort (unanswered: the first step holds).
    with contextlib.suppress(PrometheusUnreachable):
        if prometheus is not None:
            refuse_unjudged_replicas(prometheus, config.proxy_job, model)
    offline = offline_summary(read, config.replay, labels.stable)
    flips = read.report["task"]["kind"] == "classification"
    resolved = resolve(config, prometheus, model, offline, flips, now)
    bake = bake_of(config, resolved)
    for line in [*resolved.lines(), bake["said"]]:
        log.info("model %s: %s", model, line)
    fields = {
        "plan": resolved.plan.text(),
        "sizing": resolved.record(),
        "bake": bake,
        "stable": labels.stable,
        "flips": flips,
        "report": str(read.path),
        "report_sha256": read.sha256,
        "offline": offline,
        "gate": asdict(config.gate),
        "prometheus": config.prometheus,
        "routing_file": str(config.routing_file),
        "sticky_header": config.sticky_header,
        "sticky_salt": config.sticky_salt or default_sticky_salt(model, version),
    }
    return Begun(version, resolved.plan, fields)


def _refuse_labels(model: str, version: int, labels: Rollout, staging: bool) -> None:
    if labels.stable is None:
        raise TrainserveError(
            f"model {model} has no stable version: expected `trainserve promote` for the first one "
            "(clients ask for `stable`; there is nothing to shift them from)"
        )
    if version == labels.stable:
        raise TrainserveError(f"model {model} version {version} is already stable: nothing to roll out")
    if labels.candidate != version and not staging:
        raise TrainserveError(
            f"version {version} is not the candidate yet: expected --server, so that it is labelled once loaded"
        )
