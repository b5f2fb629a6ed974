"""Where a progressive rollout stands, read back from the rollout history, so that a killed controller resumes
the step it was in with the time it had left.

Each event is one history line `{"action": "rollout", "event": ..., "model": ..., "candidate": ...}`:
    start        the offline evidence held; the plan, stable, the thresholds
    step         a step entered: its index, when (epoch seconds), the proxy's counters then (its counts' origin)
    check        one look at Prometheus: every query with its value, the step's counts, each check, the decision,
                 and the step's counting state when it changed (trainserve.rollout.measure)
    paused       held longer than --max-hold: the controller stopped, the routing left where it was
    rollback     decided (why); rolled-back once the routing is cleared and the `candidate` label dropped
    promote      decided; promoted once `stable` moved (promote's own history line beside it) and routing cleared
The event is written before the move it announces, so a controller killed in between redoes the move.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ROLLOUT = "rollout"
START, STEP, CHECK, PAUSED = "start", "step", "check", "paused"
ROLLBACK, ROLLED_BACK, PROMOTE, PROMOTED = "rollback", "rolled-back", "promote", "promoted"
TERMINAL = (ROLLED_BACK, PROMOTED)


@dataclass
class Progress:
    """A rollout begun and not finished: its start record, the step it is in, a move decided but not done."""

    start: dict
    step: int | None = None  # None: started, no step entered yet
    step_started: float | None = None
    counters: dict[str, float] = field(default_factory=dict)
    pending: dict | None = None  # the ROLLBACK or PROMOTE event whose move may not be finished

    @property
    def candidate(self) -> int:
        return self.start["candidate"]


def event(kind: str, model: str, candidate: int, **fields) -> dict:
    return {"action": ROLLOUT, "event": kind, "model": model, "candidate": candidate, **fields}


def in_progress(history: list[dict], model: str) -> Progress | None:
    """The unfinished rollout of `model`, from its last `start` on (None: none, or the last one finished)."""
    mine = [e for e in history if e.get("action") == ROLLOUT and e.get("model") == model]
    starts = [i for i, e in enumerate(mine) if e["event"] == START]
    if not starts:
        return None
    since = mine[starts[-1] :]
    if any(e["event"] in TERMINAL for e in since):
        return None
    progress = Progress(start=since[0])
    for entry in since[1:]:
        if entry["event"] == STEP:
            progress.step, progress.step_started = entry["step"], entry["started"]
            progress.counters = dict(entry["counters"])
        elif entry["event"] == CHECK and entry.get("state"):
            progress.counters = dict(entry["state"])
        elif entry["event"] in (ROLLBACK, PROMOTE):
            progress.pending = entry
    return progress
