"""Where a progressive rollout stands, read back from the rollout history, so that a killed controller resumes
the step it was in with the time it had left.

Each event is one history line `{"action": "rollout", "event": ..., "model": ..., "candidate": ...}`:
    start        the offline evidence held; the plan, stable, the thresholds
    step         a step entered: its index, when (epoch seconds), the proxy's counters then (its counts' origin)
    check        one look at Prometheus: every query with its value, the step's counts, each check, the decision,
                 and the step's counting state when it changed (trainserve.rollout.measure)
    paused       held longer than the step's hold (--max-hold unless the plan sets it): the controller stopped
                 with the safe routing (no canary share, no shadow), the step's time watched so far (`watched`)
    resumed      a controller run again after a pause or a stop: the step it resumes, its counts (after a pause,
                 every replica's counters re-read as their new start, the step's counts kept) and when it began,
                 moved by the time it stood still
    rollback     decided (why); rolled-back once every proxy replica left the canary, the `candidate` label is
                 dropped, the server no longer serves the version and the model's route is removed
    promote      decided; promoted once `stable` moved (promote's own history line beside it) and routing cleared
    bake         with a bake (the START record's `bake`, trainserve.rollout.bake): begun after `promoted`, with
                 previous's counts over the last step (`baseline`) and the bake's counting state; its looks are
                 `check` records (`bake`: true); a failure is a `rollback` (stable moved back to previous, then
                 rolled-back); `baked` ends it with the version kept. A rollout with a bake is in progress until then
    awaiting-approval  --approve-before: the controller holds the route with no canary share before the step
    approved     `trainserve rollout --approve --reason TEXT`: who, why (trainserve.rollout.approval)
    notified     --notify: at the controller's exit, the notifications delivered and those that failed
The event is written before the move it announces, so a controller killed in between redoes the move. While a
rollout is in progress, `trainserve candidate`, `promote` and `rollback` of its model refuse (`refuse_during`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from trainserve.errors import TrainserveError
from trainserve.rollout.config_file import history_path
from trainserve.rollout.history import read_history

ROLLOUT = "rollout"
START, STEP, CHECK, PAUSED, RESUMED = "start", "step", "check", "paused", "resumed"
ROLLBACK, ROLLED_BACK, PROMOTE, PROMOTED = "rollback", "rolled-back", "promote", "promoted"
BAKE, BAKED = "bake", "baked"
TERMINAL = (ROLLED_BACK, PROMOTED, BAKED)  # PROMOTED: where the START record sets no bake (`ended`)
AWAITING, APPROVED, NOTIFIED = "awaiting-approval", "approved", "notified"


@dataclass
class Progress:
    """A rollout begun and not finished: its start record, the step it is in, a move decided but not done."""

    start: dict
    step: int | None = None  # None: started, no step entered yet
    step_started: float | None = None
    counters: dict[str, float] = field(default_factory=dict)
    pending: dict | None = None  # the ROLLBACK or PROMOTE event whose move may not be finished
    paused: bool = False  # stopped by its hold in its step (resumed with its counts)
    watched: float = 0.0  # the paused step's time watched before the pause
    entered: list[int] = field(default_factory=list)  # the steps entered, in order
    promoted: bool = False  # promoted, its bake not over (trainserve.rollout.bake)
    baking: dict | None = None  # the BAKE record, once the bake began

    @property
    def candidate(self) -> int:
        return self.start["candidate"]

    @property
    def past_steps(self) -> bool:
        """A move decided (stable may be the candidate already), or the promotion done and its bake not over."""
        return self.pending is not None or self.promoted


def event(kind: str, model: str, candidate: int, **fields) -> dict:
    return {"action": ROLLOUT, "event": kind, "model": model, "candidate": candidate, **fields}


def in_progress(history: list[dict], model: str) -> Progress | None:
    """The unfinished rollout of `model`, from its last `start` on (None: none, or the last one finished)."""
    mine = [e for e in history if e.get("action") == ROLLOUT and e.get("model") == model]
    starts = [i for i, e in enumerate(mine) if e["event"] == START]
    if not starts:
        return None
    since = mine[starts[-1] :]
    if ended(since) is not None:
        return None
    progress = Progress(start=since[0])
    for entry in since[1:]:
        if entry["event"] == PROMOTED:  # its bake to come
            progress.promoted, progress.pending = True, None
        elif entry["event"] == BAKE:
            progress.baking, progress.step_started = entry, entry["started"]
            progress.counters = dict(entry["counters"])
        elif entry["event"] in (STEP, RESUMED):
            progress.step, progress.step_started = entry["step"], entry["started"]
            progress.counters, progress.paused = dict(entry["counters"]), False
            if entry["event"] == STEP:
                progress.entered.append(entry["step"])
        elif entry["event"] == PAUSED:
            progress.paused, progress.watched = True, entry.get("watched", 0.0)
        elif entry["event"] == CHECK and entry.get("state"):
            progress.counters = dict(entry["state"])
        elif entry["event"] in (ROLLBACK, PROMOTE):
            progress.pending = entry
    return progress


def ended(records: list[dict]) -> int | None:
    """The index of the record that ended the rollout whose START record is `records[0]` (None: not ended): a
    rollback, a bake's end, or the promotion of a rollout without a bake."""
    bakes = bool((records[0].get("bake") or {}).get("seconds")) if records else False
    for i, entry in enumerate(records):
        if entry["event"] in TERMINAL and not (entry["event"] == PROMOTED and bakes):
            return i
    return None


class RolloutInProgress(TrainserveError):
    """A label move refused because a rollout of the model owns its labels until it ends."""


def refuse_during(config: Path, model: str, action: str, rollout: dict | None = None) -> Progress | None:
    """Refuse `action` on `model` while a rollout of it is in progress, unless `rollout` (a START record) is that
    rollout acting on its own candidate; returns the rollout in progress (None: none)."""
    progress = in_progress(read_history(history_path(config)), model)
    if progress is None or (rollout is not None and same_rollout(progress.start, rollout)):
        return progress
    raise RolloutInProgress(
        f"{action} refused: a rollout of model {model} version {progress.candidate} is in progress "
        f"({history_path(config)}): expected it to end first (or `trainserve rollout --abort --reason TEXT`)"
    )


def same_rollout(a: dict, b: dict) -> bool:
    """Two START records of one rollout (as written, and as read back from the history)."""
    return all(a.get(key) == b.get(key) for key in ("model", "candidate", "time", "by", "report_sha256"))
