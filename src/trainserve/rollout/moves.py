"""The moves a progressive rollout makes: the proxy's routing file set to a step's shares, held (no share),
removed, and the `candidate` label dropped from the serving config (stable untouched). Each is idempotent, so a
resumed controller can redo the move it may have been killed in, and each routing change is a read-modify-write
under the routing file's lock, so that two controllers (two models, one file) never undo each other.

Order matters for the clients (trainserve.rollout.ends): a rollback holds the route (no canary share, no shadow),
waits until every proxy replica reports it, only then drops the label, and removes the route once the server no
longer serves the version: no request is routed to a version the server has unloaded, and a request naming no
version (which TF Serving answers with its highest version) is answered by stable while the candidate is loaded.

`trainserve candidate --routing-file` makes the same first move as the controller (`route_before_staging`: the
model routed with no share, followed by every replica, before the version loads), and `promote` and `rollback`
remove that route once no `candidate` is labelled (`release_route`): a candidate staged by hand, and judged by eval
before any rollout, never answers a request that names no version.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path

from trainserve.errors import TrainserveError
from trainserve.files import locked
from trainserve.proxy.routing import ModelRoute, read_routing, update_routing
from trainserve.rollout.config import CandidateConfig
from trainserve.rollout.config_file import find_model, read_config, write_config
from trainserve.rollout.follow import await_followers, routed_to
from trainserve.rollout.labels import Rollout, apply_rollout
from trainserve.rollout.prometheus import Prometheus

log = logging.getLogger(__name__)


def route_of(path: Path, model: str) -> ModelRoute | None:
    """The model's route in the routing file now (None: not routed)."""
    return read_routing(path).route(model)


def step_route(start: dict, shadow: float, canary: float) -> ModelRoute:
    """The rollout's route (its START record: candidate, sticky header and salt) with these shares."""
    tolerance = ((start.get("offline") or {}).get("difference") or {}).get("tolerance")  # regression copies
    return ModelRoute(
        start["candidate"], shadow, canary, start.get("sticky_header"), start.get("sticky_salt"), tolerance
    )


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


def clear_route(path: Path, model: str) -> bool:
    """The model is no longer routed (a file that no longer parses is replaced by one without routes); returns
    whether it was."""
    routed = _update(path, model, lambda current: None, True) is not None
    if routed:
        log.info("routing %s: model %s no longer routed", path, model)
    return routed


def route_before_staging(config: CandidateConfig, model: str, version: int, labels: Rollout) -> None:
    """Before `version` loads as the candidate (labels: the model's now): the model routed with no share, naming
    `version`, and, with --prometheus, confirmed by every proxy replica; a refusal (a route with a share, the
    replicas not following within --wait) stages nothing. A model with no `stable` yet is not routed: a request
    naming no version has no stable to go to."""
    if config.routing_file is None:
        return
    if labels.stable is None:
        log.info("model %s has no stable version yet: not routed (requests naming no version get TF Serving's)", model)
        return
    _update(config.routing_file, model, lambda current: _no_share(config.routing_file, model, current, version))
    log.info(
        "routing %s: model %s routed with no share (requests naming no version: stable)", config.routing_file, model
    )
    if config.prometheus is None:
        log.warning(
            "model %s: no --prometheus to confirm that every proxy replica follows the route: a replica that has not "
            "read it yet answers requests naming no version with version %d once it loads",
            model,
            version,
        )
        return
    why = await_followers(Prometheus(config.prometheus), config.proxy_job, model, routed_to(version), config.wait)
    if why is not None:
        raise TrainserveError(
            f"model {model} version {version} not staged: not every proxy replica reports the model's route within "
            f"--wait {config.wait:g} s ({why}); the route stays (requests naming no version answered by stable): run "
            "the same command again"
        )


def refuse_a_share(path: Path, model: str, current: ModelRoute | None, before: str) -> None:
    """A route giving a version a share is someone's canary or shadow: left alone (its version would be unloaded
    under it), and `before` (staging, a rollout) refused; a route with no share may be taken over."""
    if current is not None and (current.shadow_percent or current.canary_percent):
        raise TrainserveError(
            f"routing file {path} gives version {current.candidate} of model {model} a share (shadow "
            f"{current.shadow_percent:g} %, canary {current.canary_percent:g} %): expected no share before {before} "
            "(end that canary or shadow first)"
        )


def _no_share(path: Path, model: str, current: ModelRoute | None, version: int) -> ModelRoute:
    """The model's route before staging `version`."""
    refuse_a_share(path, model, current, "staging a candidate")
    return ModelRoute(version)


def release_route(path: Path | None, model: str, labels: Rollout) -> bool:
    """After promote or rollback (labels: the model's now), the model's route removed if no `candidate` is labelled
    any more; kept while one is (it still keeps requests naming no version off it). Returns whether it was."""
    return path is not None and labels.candidate is None and clear_route(path, model)


def _update(
    path: Path, model: str, change: Callable[[ModelRoute | None], ModelRoute | None], replace_broken: bool = False
) -> ModelRoute | None:
    """The model's route changed under the routing file's lock (written only if it changed); returns the route it
    had before (None: none)."""
    before: list[ModelRoute | None] = []
    update_routing(path, model, lambda current: before.append(current) or change(current), replace_broken)
    return before[0]


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
