"""One rollout read back from the history (trainserve.rollout.progress documents its events) as a typed account:
its START record, each stint of a step (a step entered, and its looks until the next move; a step entered again
after a pause is a stint of its own, its counts begun afresh), the holds, the moments that moved it, and how it
ended. What the page (trainserve.rollout.report.page) shows, and nothing it computes again but the per-replica
counts, tallied from the counting states the history keeps as the controller tallied them."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

from trainserve.errors import TrainserveError
from trainserve.rollout import analysis
from trainserve.rollout.analysis import Check
from trainserve.rollout.counting import tallied
from trainserve.rollout.history import read_history
from trainserve.rollout.measure import COUNTERS, LATENCY_COUNTERS
from trainserve.rollout.plan import parse_plan
from trainserve.rollout.progress import (
    BAKE,
    BAKED,
    CHECK,
    PAUSED,
    PROMOTE,
    PROMOTED,
    RESUMED,
    ROLLBACK,
    ROLLED_BACK,
    ROLLOUT,
    START,
    STEP,
    ended,
)

CHECK_FIELDS = frozenset(f.name for f in fields(Check))
# How a rollout stands at the end of its history: its last move.
REBASED = "rebased"  # a state after which each replica's counters start again (a resumed pause)
OUTCOMES = {
    PROMOTED: "promoted",
    BAKED: "promoted",
    ROLLED_BACK: "rolled back",
    PAUSED: "paused",
    ROLLBACK: "rollback pending",
}
IN_PROGRESS = "in progress"


@dataclass(frozen=True)
class Look:
    """One look at Prometheus: its number in the stint (from 1), when, what each check found, the decision."""

    number: int
    time: str
    decision: str
    checks: tuple[Check, ...]
    unjudged: str | None = None


@dataclass
class Stint:
    """A step as entered once: its index in the plan, its words, its looks, and each replica's count of each
    counter over it (counter -> instance -> count)."""

    index: int
    words: str
    entered: str
    again: bool  # entered again after a pause
    looks: list[Look] = field(default_factory=list)
    replicas: dict[str, dict[str, int]] = field(default_factory=dict)
    states: list[dict] = field(default_factory=list)
    resumed: list[int] = field(default_factory=list)  # the looks seen before each resume: no hold runs across one

    def check_names(self) -> list[str]:
        return list(dict.fromkeys(c.name for look in self.looks for c in look.checks))


@dataclass(frozen=True)
class Hold:
    """Consecutive looks that held a stint at its end: the first and last, and why at the last."""

    stint: Stint
    first: Look
    last: Look

    @property
    def why(self) -> str:
        said = [f"{c.name}: {c.said}" for c in self.last.checks if c.result != analysis.PASS]
        return "; ".join(said + ([self.last.unjudged] if self.last.unjudged else [])) or "no check could be judged"


@dataclass(frozen=True)
class Moment:
    """A record that moved the rollout (started, a step entered, paused, decided, ended): when, by whom, what."""

    time: str
    by: str
    event: str
    step: int | None
    said: str


@dataclass
class Account:
    model: str
    start: dict
    stints: list[Stint]
    holds: list[Hold]
    moments: list[Moment]
    last: dict  # the rollout's last record that is not a look

    @property
    def candidate(self) -> int:
        return self.start["candidate"]

    @property
    def outcome(self) -> str:
        return OUTCOMES.get(self.last["event"], IN_PROGRESS)


def read_account(history: Path, model: str | None = None) -> Account:
    """The last rollout of `model` (None: the history's only model with a rollout) in the history file."""
    records = read_history(history)
    rollouts = [r for r in records if r.get("action") == ROLLOUT]
    models = sorted({r["model"] for r in rollouts if r.get("event") == START})
    if not models:
        raise TrainserveError(f"{history} has no rollout: expected the history of a config `trainserve rollout` used")
    if model is None and len(models) > 1:
        raise TrainserveError(f"{history} has rollouts of models {models}: expected --model naming one")
    model = models[0] if model is None else model
    if model not in models:
        raise TrainserveError(f"{history} has no rollout of model {model!r}: it has rollouts of {models}")
    return account_of([r for r in rollouts if r["model"] == model], model)


def account_of(records: list[dict], model: str) -> Account:
    """The account of the last rollout among `records` (one model's, oldest first)."""
    first = max(i for i, r in enumerate(records) if r["event"] == START)
    mine = records[first:]
    end = ended(mine)
    mine = mine[: end + 1] if end is not None else mine
    account = Account(model, mine[0], [], [], [], mine[0])
    for record in mine:
        _take(account, record)
    for stint in account.stints:
        stint.replicas = per_replica(stint.states)
    account.holds = [hold for stint in account.stints for hold in holds_of(stint)]
    return account


def _take(account: Account, record: dict) -> None:
    kind = record["event"]
    if kind == CHECK:
        stint = account.stints[-1]
        stint.looks.append(_look(len(stint.looks) + 1, record))
        if record.get("state"):
            stint.states.append(record["state"])
        return
    if kind == RESUMED:  # the same stint goes on with its counts; after a pause every replica starts again
        account.stints[-1].states.append({**record["counters"], REBASED: record.get("after") == "a pause"})
        account.stints[-1].resumed.append(len(account.stints[-1].looks))
    if kind in (STEP, BAKE):  # the bake: a stint of the plan's `100%` step, its words its own
        again = kind == STEP and any(s.index == record["step"] for s in account.stints)
        words = record.get("words") or parse_plan(account.start["plan"]).steps[record["step"]].words()
        account.stints.append(Stint(record["step"], words, record.get("time", ""), again, states=[record["counters"]]))
    account.last = record
    account.moments.append(_moment(record, account))


def _look(number: int, record: dict) -> Look:
    checks = tuple(Check(**{k: v for k, v in c.items() if k in CHECK_FIELDS}) for c in record.get("checks", []))
    return Look(number, record.get("time", ""), record["decision"], checks, record.get("unjudged"))


def _moment(record: dict, account: Account) -> Moment:
    kind, step = record["event"], record.get("step")
    said = record.get("said") or ""
    if kind == START:
        said = f"plan {record['plan']}; stable version {record['stable']}"
    elif kind == STEP:
        again = account.stints[-1].again
        said = f"{account.stints[-1].words}{': entered again after a pause (resumed)' if again else ''}"
    elif kind == PAUSED:
        said = f"held {record.get('held_seconds', 0):.0f} s: {said}"
    elif kind == RESUMED:
        said = f"{account.stints[-1].words}: resumed after {record.get('after', 'a stop')} with its counts"
    elif kind == BAKE:
        said = f"{record.get('words')}: previous version {record.get('previous')} kept loaded and judged against"
    elif kind in (PROMOTE, PROMOTED) and not said:
        said = "every step passed" if kind == PROMOTE else "stable is the candidate"
    return Moment(record.get("time", ""), record.get("by", ""), kind, step, said)


def holds_of(stint: Stint) -> list[Hold]:
    """The runs of consecutive looks that held the stint; a pause ends one (what held before it, and why, is not
    what held the rerun)."""
    found, run = [], []
    for look in [*stint.looks, None]:
        if run and look is not None and look.number - 1 in stint.resumed:
            found.append(Hold(stint, run[0], run[-1]))
            run = []
        if look is not None and look.decision == analysis.HOLD:
            run.append(look)
        elif run:
            found.append(Hold(stint, run[0], run[-1]))
            run = []
    return found


def per_replica(states: list[dict]) -> dict[str, dict[str, int]]:
    """Each replica's count of each counter over a stint, from its counting states in order (the step's origin
    first): the increases each instance showed between the states that saw it, a restart counted from 0, as
    trainserve.rollout.counting tallies the step's counts. Counters no replica counted are left out."""
    counted: dict[str, dict[str, int]] = {}
    for name in (*COUNTERS, *LATENCY_COUNTERS):
        seen: dict[str, int] = {}
        counts: dict[str, int] = {}
        for state in states:
            if state.get(REBASED):  # what the counters moved while the route was held is not the step's
                seen = {}
            for instance, value in (state.get("seen") or {}).get(name, {}).items():
                last = {instance: seen[instance]} if instance in seen else {}
                after, counts[instance] = tallied(last, counts.get(instance, 0), {instance: value})
                seen[instance] = after[instance]
        if any(counts.values()):
            counted[name] = counts
    return counted
