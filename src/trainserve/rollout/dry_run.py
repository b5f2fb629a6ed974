"""`trainserve rollout --dry-run`: what a rollout would do, read from the config, the reports and the plan, with
nothing written: the evidence's verdict, each step's routing and checks, the PromQL queries (per proxy replica:
trainserve.rollout.measure)."""

from __future__ import annotations

from trainserve.errors import TrainserveError
from trainserve.rollout import analysis, measure, targets
from trainserve.rollout.config import RolloutConfig
from trainserve.rollout.config_file import find_model, read_config
from trainserve.rollout.controller import candidate_of
from trainserve.rollout.labels import Rollout
from trainserve.rollout.offline import evidence_of
from trainserve.rollout.plan import PROMOTE

LE, LOWER = "LE", "LOWER"  # the step's latency threshold's bucket bounds, known once it begins


def dry_run(config: RolloutConfig) -> list[str]:
    """What the rollout would do, as lines: the evidence's verdict, each step's routing and checks, the queries."""
    config.check()
    served = read_config(config.config)
    model = find_model(served, config.config, config.model)
    labels, plan = Rollout.of(model), config.plan
    version = candidate_of(config, labels, model.name)
    stable = labels.stable if labels.stable is not None else "STABLE"
    try:
        read = evidence_of(config, model.name, labels, version)
        flips = read.report["task"]["kind"] == "classification"
        lines = [f"evidence: {read.path} holds every check promote makes"]
    except TrainserveError as exc:
        flips, lines = True, [f"evidence: REFUSED: {exc}"]
    lines.append(f"model {model.name}: stable {stable}, candidate {version}; routing file {config.routing_file}")
    for i, step in enumerate(plan.steps):
        if step.kind == PROMOTE:
            lines.append(f"step {i + 1}: 100%: promote (stable -> {version}), routing cleared")
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
