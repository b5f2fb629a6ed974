"""`trainserve rollout --dry-run`: what a rollout would do, read from the config, the reports, the plan and the
model's traffic, with nothing written: the evidence's verdict, the plan (`auto`: sized to the traffic) and what each
step should take at that traffic (trainserve.rollout.sizing), each step's routing and checks, the PromQL queries
(per proxy replica: trainserve.rollout.measure)."""

from __future__ import annotations

import time

from trainserve.errors import TrainserveError
from trainserve.rollout import analysis, measure, targets
from trainserve.rollout.bake_checks import bake_check_names
from trainserve.rollout.bake_size import bake_of
from trainserve.rollout.config_file import find_model, read_config
from trainserve.rollout.labels import Rollout
from trainserve.rollout.offline import evidence_of, offline_summary
from trainserve.rollout.plan import AUTO, PROMOTE, Plan
from trainserve.rollout.prometheus import Prometheus
from trainserve.rollout.rollout_config import RolloutConfig, step_index
from trainserve.rollout.sizing.auto import Resolved, resolve
from trainserve.rollout.start import candidate_of

LE, LOWER = "LE", "LOWER"  # the step's latency threshold's bucket bounds, known once it begins


def dry_run(config: RolloutConfig) -> list[str]:
    """What the rollout would do, as lines: the evidence's verdict, each step's routing and checks, the queries."""
    config.check()
    served = read_config(config.config)
    model = find_model(served, config.config, config.model)
    labels = Rollout.of(model)
    version = candidate_of(config, labels, model.name)
    stable = labels.stable if labels.stable is not None else "STABLE"
    offline = {}
    try:
        read = evidence_of(config, model.name, labels, version)
        flips = read.report["task"]["kind"] == "classification"
        offline = offline_summary(read, config.replay, labels.stable) if labels.stable is not None else {}
        lines = [f"evidence: {read.path} holds every check promote makes"]
    except TrainserveError as exc:
        flips, lines = True, [f"evidence: REFUSED: {exc}"]
    lines.append(f"model {model.name}: stable {stable}, candidate {version}; routing file {config.routing_file}")
    prometheus = Prometheus(config.prometheus) if config.prometheus else None
    try:
        resolved = resolve(config, prometheus, model.name, offline, flips, time.time())
    except TrainserveError as exc:
        if config.plan == AUTO:
            return [*lines, f"plan auto: REFUSED: {exc}"]
        raise
    plan = resolved.plan
    lines += [*resolved.lines(), *_approval(config, plan)]
    for i, step in enumerate(plan.steps):
        if step.kind == PROMOTE:
            lines.append(f"step {i + 1}: 100%: promote (stable -> {version}), routing cleared")
            lines += _bake(config, resolved, plan.shadow_during(i), stable, flips)
            continue
        names = analysis.check_names(step, flips and plan.shadow_during(i) > 0)
        lines.append(
            f"step {i + 1}: {step.words()}: shadow {plan.shadow_during(i):g}%, canary {plan.canary_during(i):g}%; "
            f"checks {', '.join(names)}"
        )
    job = config.proxy_job
    lines.append(f"queries (to {config.prometheus or 'PROMETHEUS'}, every {config.interval:g} s; scrape job {job!r}):")
    lines.append(f'  targets: up{{job="{job}"}}; up without request counts: {targets.silent_query(job)}')
    lines += [f"  {name}: {q}" for name, q in measure.queries(model.name, version, stable, job, LE, LOWER).items()]
    lines.append(f"  ({LE}, {LOWER}: the bucket of stable's p99 when a step begins, from {measure.THRESHOLD})")
    return lines


def _approval(config: RolloutConfig, plan: Plan) -> list[str]:
    """Where --approve-before waits, in the plan as resolved (a refusal, as the start would refuse it)."""
    if config.approve_before is None:
        return []
    try:
        index = step_index(plan, config.approve_before)
    except TrainserveError as exc:
        return [f"approval: REFUSED: {exc}"]
    return [
        f"approval: before step {index + 1} ({plan.steps[index].words()}) the route is held with no canary share "
        "until `trainserve rollout --approve --reason TEXT`"
    ]


def _bake(config: RolloutConfig, resolved: Resolved, shadow: float, stable: int | str, flips: bool) -> list[str]:
    """The bake after the promotion (trainserve.rollout.bake), as the START record would set it."""
    bake = bake_of(config, resolved)
    if not bake["seconds"]:
        return [f"  {bake['said']}"]
    names = bake_check_names(flips and shadow > 0)
    return [
        f"  {bake['said']}",
        f"  during the bake: stable answers every client; previous ({stable}) kept loaded, routed with no canary "
        f"share, shadow {shadow:g}% copied to it; checks {', '.join(names)}; a failure moves stable back to "
        "previous (every proxy replica confirmed before the version unloads)",
    ]
