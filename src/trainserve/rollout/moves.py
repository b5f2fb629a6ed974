"""The moves a progressive rollout makes: the proxy's routing file set to a step's shares, held (no share),
removed, and the `candidate` label dropped from the serving config (stable untouched). Each is idempotent, so a
resumed controller can redo the move it may have been killed in, and each routing change is a read-modify-write
under the routing file's lock, so that two controllers (two models, one file) never undo each other.

Order matters for the clients (trainserve.rollout.ends): a rollback holds the route (no canary share, no shadow),
waits until every proxy replica reports it, only then drops the label, and removes the route once the server no
longer serves the version: no request is routed to a version the server has unloaded, and a request naming no
version (which TF Serving answers with its highest version) is answered by stable while the candidate is loaded.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path

from trainserve.errors import TrainserveError
from trainserve.files import locked
from trainserve.proxy.routing import ModelRoute, read_routing, update_routing
from trainserve.rollout.config_file import find_model, read_config, write_config
from trainserve.rollout.labels import Rollout, apply_rollout

log = logging.getLogger(__name__)


def route_of(path: Path, model: str) -> ModelRoute | None:
    """The model's route in the routing file now (None: not routed)."""
    return read_routing(path).route(model)


def step_route(start: dict, shadow: float, canary: float) -> ModelRoute:
    """The rollout's route (its START record: candidate, sticky header and salt) with these shares."""
    return ModelRoute(start["candidate"], shadow, canary, start.get("sticky_header"), start.get("sticky_salt"))


def set_route(path: Path, model: str, route: ModelRoute) -> None:
    """The model's route becomes `route`; other models' routes are kept."""
    _update(path, model, lambda current: route)
    log.info(
        "routing %s: model %s -> candidate %d, shadow %g%%, canary %g%%",
        path,
        model,
        route.candidate,
        route.shadow_percent,
        route.canary_percent,
    )


def hold_route(path: Path, model: str) -> bool:
    """The model's route, if it has one, with no canary share and no shadow: every `stable` request (and every
    request naming no version) answered by stable. Returns whether the model is routed. A routing file that no
    longer parses is replaced by one without routes (everything to stable): a safe move must not wait on it."""
    held = _update(path, model, lambda r: r and dataclasses.replace(r, shadow_percent=0, canary_percent=0), True)
    if held is not None:
        log.info("routing %s: model %s held on stable (no canary share, no shadow)", path, model)
    return held is not None


def clear_route(path: Path, model: str) -> None:
    """The model is no longer routed (a file that no longer parses is replaced by one without routes)."""
    _update(path, model, lambda current: None, True)
    log.info("routing %s: model %s no longer routed", path, model)


def _update(
    path: Path, model: str, change: Callable[[ModelRoute | None], ModelRoute | None], replace_broken: bool = False
) -> ModelRoute | None:
    """The model's route changed under the routing file's lock (written only if it changed); returns it."""
    return update_routing(path, model, change, replace_broken).route(model)


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
