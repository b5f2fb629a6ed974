"""`live-eval --state`: the watch of the version `stable` names, across daily runs.

Each run, after the join: the stable version and the promotion that made it stable are read from --config and its
history (trainserve.rollout), the baseline from that promotion's eval report (or `previous`, paired), and, under
a lock beside the state, the labelled examples no earlier run counted are added to the state (trainserve.live.
state), the anytime-valid bounds judged (trainserve.live.sequential) and the state replaced. A drop shown beyond
--max-drop fails the run; with --on-drop rollback it also moves `stable` back to `previous` with `trainserve
rollback`'s own code, its reason in the rollout history. The fixed-horizon gates and the estimate keep paging
(exit 1) on their own; only the watch acts.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path

import numpy as np

from trainserve.errors import TrainserveError
from trainserve.files import locked
from trainserve.live.config import LiveEvalConfig, drop_margin
from trainserve.live.promotion import baseline_of, stable_promotion
from trainserve.live.sequential import (
    Pace,
    change_bounds,
    one_sided_alpha,
    runs_to_show,
    said_drop,
    verdict,
)
from trainserve.live.state import NOT_ANSWERED, WatchState, continued, write_state

DAY_S = 86400
# (serving config, model, reason, routing file) -> what moved: `trainserve rollback`'s step, wired by trainserve.cli
RollBack = Callable[[Path, str, str, Path | None], str]


def watch(config: LiveEvalConfig, joined, now: float, roll_back: RollBack | None = None) -> dict:
    """Count the stable version's new labelled answers into --state, judge, act; the report's `watch` section."""
    w = config.watch
    version, promotion = stable_promotion(w.config, config.model)
    baseline = baseline_of(promotion, w.against)
    margin = drop_margin(config.max_drop).drop
    fresh = WatchState(config.model, version, promotion["time"], baseline, margin, config.level)
    with locked(w.state):
        state, restarted = continued(w.state, fresh)
        held = state.baseline  # fixed at the promotion's first run
        base = None if held.design == "held-out" else _answered(joined, held.version)
        run = state.count(joined.labels.keys, _answered(joined, version), base)
        alpha = one_sided_alpha(state.level)
        bounds = change_bounds(state.counts, state.baseline, alpha)
        found = verdict(bounds, margin)
        state.runs.append({"time": _iso(now), **run, "bounds": list(bounds), "verdict": found})
        write_state(w.state, state)
        section = _section(state, run, bounds, found, alpha, restarted, w)
        if found == "drop shown" and w.on_drop == "rollback" and state.acted is None:
            state.acted = act(roll_back, config, version, section["said"], now)
            write_state(w.state, state)
        section["rollback"] = state.acted
    return section


def _answered(joined, version: int) -> np.ndarray:
    """Per label: -1 the version did not answer it, 0 wrong, 1 right."""
    found = joined.answered.get(version)
    return found if found is not None else np.full(len(joined.labels.keys), NOT_ANSWERED, np.int8)


def act(roll_back: RollBack | None, config: LiveEvalConfig, version: int, said: str, now: float) -> dict:
    """Roll back with `trainserve rollback`'s own step (`roll_back`, wired by trainserve.cli: the live stage imports
    no other), its reason the watch's words; a refusal is said, not raised."""
    w = config.watch
    try:
        stable, _ = stable_promotion(w.config, config.model)
        if stable != version:  # moved since this run read it: the rollback would move another version
            raise TrainserveError(f"version {version} is no longer stable (version {stable} is): nothing moved")
        if roll_back is None:
            raise TrainserveError("no rollback step wired in (run it as `trainserve live-eval`)")
        moved = roll_back(w.config, config.model, f"live-eval --on-drop rollback: {said}", w.routing_file)
    except TrainserveError as exc:
        return {"done": False, "time": _iso(now), "said": f"rollback not done: {exc}"}
    return {"done": True, "time": _iso(now), "said": f"rolled back: {moved}"}


def _section(state: WatchState, run: dict, bounds, found: str, alpha: float, restarted, w) -> dict:
    c, b = state.counts, state.baseline
    per_day = labels_per_day(state.runs)
    nights = len({r["time"][:10] for r in state.runs})  # a retried run is not another night
    pace = Pace(nights, c.examples, per_day, (c.only + c.baseline_only) / max(c.examples, 1))
    runs = runs_to_show(pace, b, state.margin, alpha)
    accuracy = "n/a" if not c.examples else f"{c.correct / c.examples:.4f}"
    said = (
        f"version {state.version} live accuracy {accuracy} on {c.examples} labelled examples over "
        f"{len(state.runs)} run(s) vs {b.describe()}: change within [{bounds[0]:+.4f}, {bounds[1]:+.4f}] "
        f"(anytime, one-sided {alpha:g} each end): {found} (--max-drop {state.margin:g})"
    )
    return {
        "state": str(w.state),
        "model": state.model,
        "version": state.version,
        "promoted": state.promoted,
        "baseline": b.to_json(),
        "margin": state.margin,
        "alpha": alpha,
        "counts": vars(c),
        "run": run,
        "runs": len(state.runs),
        "bounds": list(bounds),
        "verdict": found,
        "restarted": restarted,
        "on_drop": w.on_drop,
        "labels_per_day": per_day,
        "runs_to_show": runs,
        "rate_said": rate_said(per_day, runs, state.margin),
        "said": said,
    }


def labels_per_day(runs: list[dict]) -> float:
    """Labelled examples counted a day, over the days from the first run to the last (a missed day included)."""
    if not runs:
        return 0.0
    first, last = (datetime.datetime.fromisoformat(runs[i]["time"]) for i in (0, -1))
    days = max(1, round((last - first).total_seconds() / DAY_S) + 1)
    return sum(r["counted"] for r in runs) / days


def rate_said(per_day: float, runs: int | None, margin: float) -> str:
    drop = f"a {100 * said_drop(margin):g}-point drop"
    if per_day <= 0:
        return f"no labelled answer of the version counted yet: no label rate to say when {drop} would show"
    if runs is None:
        return f"at your label rate ({per_day:.0f} labelled answers a day), {drop} would not show within two years"
    return f"at your label rate ({per_day:.0f} labelled answers a day), {drop} shows within about {runs} daily runs"


def _iso(now: float) -> str:
    return datetime.datetime.fromtimestamp(now, datetime.UTC).isoformat(timespec="seconds")
