"""The moves a progressive rollout makes: the capture proxy's routing file set to a step's shares, cleared, and the
`candidate` label dropped from the serving config (stable untouched). Each is idempotent, so a resumed controller
can redo the move it may have been killed in.

Order matters for the clients: a rollback clears the routing first and only then drops the label, so no request
is ever routed to a version the server has unloaded.
"""

from __future__ import annotations

import logging
from pathlib import Path

from trainserve.capture.routing import NO_ROUTING, ModelRoute, RoutingError, read_routing, routing_with, write_routing
from trainserve.errors import TrainserveError
from trainserve.rollout.config_file import find_model, locked, read_config, write_config
from trainserve.rollout.labels import Rollout, apply_rollout

log = logging.getLogger(__name__)


def route_of(path: Path, model: str) -> ModelRoute | None:
    """The model's route in the routing file now (None: not routed)."""
    return read_routing(path).route(model)


def set_route(path: Path, model: str, route: ModelRoute) -> None:
    """The model's route becomes `route`; other models' routes are kept."""
    write_routing(path, routing_with(read_routing(path), model, route))
    log.info(
        "routing %s: model %s -> candidate %d, shadow %g%%, canary %g%%",
        path,
        model,
        route.candidate,
        route.shadow_percent,
        route.canary_percent,
    )


def clear_route(path: Path, model: str) -> None:
    """The model is no longer routed: every `stable` request answered by stable, none shadowed. A routing file that
    no longer parses is replaced by one without routes (everything to stable), since a rollback must not wait on it."""
    try:
        routing, broken = read_routing(path), False
    except RoutingError as exc:
        log.error("%s: replaced by a file without routes, to roll back", exc)
        routing, broken = NO_ROUTING, True
    if routing.route(model) is None and not broken:
        return
    write_routing(path, routing_with(routing, model, None))
    log.info("routing %s: model %s no longer routed (every stable request answered by stable)", path, model)


def drop_candidate(config_path: Path, model: str, version: int) -> tuple[Rollout, Rollout]:
    """Remove the `candidate` label (and so its version from the policy) if it still names `version`."""
    with locked(config_path):
        served = read_config(config_path)
        entry = find_model(served, config_path, model)
        before = Rollout.of(entry)
        if before.candidate != version:
            return before, before
        after = Rollout(before.stable, before.previous, None)
        if after.stable is None:
            raise TrainserveError(f"model {model}: no stable version to keep while dropping candidate {version}")
        apply_rollout(entry, after)
        write_config(config_path, served)
    log.info("model %s: label candidate (version %d) dropped; %s", model, version, after.describe())
    return before, after
