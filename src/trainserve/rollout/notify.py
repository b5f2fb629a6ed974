"""A rollout's decisions told to people (--notify URL): one JSON document per decision, made from the history
record that announces it, and posted without the controller waiting (trainserve.rollout.notify_sender):

    started            the START record: the plan, candidate, stable, the eval report it rests on
    step               a step entered (the look that advanced the one before beside it)
    held               a step inconclusive for half of --max-hold (once per step entered): it pauses at --max-hold
    awaiting-approval  --approve-before: the route held with no canary share until `trainserve rollout --approve`
    approved           that approval, as the waiting controller saw it: who, why
    paused             held past --max-hold: the controller stopped (exit 75), the route held on stable
    rolled-back        the rollback decided (a failed check, an abort, labels moved), with the look behind it
    promoted           the candidate is stable
    bake               with --bake: the bake begun, previous kept loaded (trainserve.rollout.bake); a failure during
                       it is a `rolled-back` (stable back to previous)
    baked              the bake ended with the version kept as stable

The generic document (schema `trainserve.notification/1`): `event`, `summary` (one sentence), `time` (the
record's, UTC), `started` (the rollout's START), `model`, `candidate`, `stable`, `plan`, `step` ({index, number,
of, words, shadow_percent, canary_percent}; null before the first step and for an abort), `said` (why: paused,
held, rolled back; else null), `look` (the last look: {step, decision, checks [{name, result, said}], counts}; null
before one), `report` (the rollout's decision report page: URL or path), `history`, `by` (user@host of the
record), `bake_seconds` (the bake after the promotion, 0: none); `held`: also `held_seconds` and
`max_hold_seconds`; `approved`: `reason` and `approved_by`. Fields are
only ever added within /1.

`alertmanager`: the body Alertmanager's webhook_config posts (version "4"), so that receivers built for it (chat
bridges, pagers) take a rollout as one alert: labels alertname="TrainserveRollout", model, candidate, stable (the
same for the whole rollout, so a receiver threads its updates), `firing` while it is in progress (paused and
awaiting approval included: someone may have to act) and `resolved` once it is rolled back, promoted without a
bake, or baked; the annotations carry the event, summary, description (said), step and report.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from trainserve.rollout.history import append_history, read_history
from trainserve.rollout.notify_sender import Receiver, Sender, Tally
from trainserve.rollout.plan import parse_plan
from trainserve.rollout.progress import (
    AWAITING,
    BAKE,
    BAKED,
    CHECK,
    NOTIFIED,
    PAUSED,
    PROMOTED,
    ROLLBACK,
    ROLLOUT,
    START,
    STEP,
    event,
)
from trainserve.rollout.report.write import page_path
from trainserve.rollout.rollout_config import RolloutConfig

log = logging.getLogger(__name__)

SCHEMA = "trainserve.notification/1"
ALERT = "TrainserveRollout"
NO_END = "0001-01-01T00:00:00Z"  # Alertmanager's endsAt of an alert that has not ended
# The history events a notification announces, by the notification's name for them.
ANNOUNCED = {
    START: "started",
    STEP: "step",
    AWAITING: "awaiting-approval",
    PAUSED: "paused",
    ROLLBACK: "rolled-back",
    PROMOTED: "promoted",
    BAKE: "bake",
    BAKED: "baked",
}
ENDS = ("rolled-back", "promoted", "baked")


@dataclass(frozen=True)
class Where:
    """What a document points to: the history, and the report page (under `link`, a URL, when given)."""

    history: Path
    link: str | None = None

    def report(self, start: dict) -> str:
        page = page_path(self.history, start["model"], start["candidate"])
        return f"{self.link.rstrip('/')}/{page.name}" if self.link else str(page)


class Notifier:
    """Documents of one model's rollout, from the records the controller writes (`saw`) and the holds it reports
    (`held`), sent by `sender`; without one (no --notify) it does nothing. A context manager: on exit the sender
    is flushed (FLUSH_S at most) and the deliveries are recorded in the history (NOTIFIED)."""

    def __init__(self, model: str, where: Where, sender: Sender | None):
        self.model, self.where, self.sender = model, where, sender
        self.look: dict | None = None  # the last CHECK record
        self.held_at: tuple | None = None  # (candidate, step) already told as held
        self.candidate: int | None = None

    def saw(self, record: dict, start: dict) -> None:
        if self.sender is None:
            return
        kind, self.candidate = record["event"], record["candidate"]
        start = record if kind == START else start  # the START record is the rollout's start once written
        if kind == CHECK:
            self.look = record
        if kind == STEP:
            self.held_at = None
        if kind in ANNOUNCED:
            self._send(start, record, ANNOUNCED[kind])

    def held(self, start: dict, index: int, held_s: float, max_hold_s: float, why: str) -> None:
        """A step inconclusive for `held_s`: told once per step entered, past half of --max-hold."""
        at = (start["candidate"], index)
        if self.sender is None or held_s < max_hold_s / 2 or self.held_at == at:
            return
        self.held_at = at
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())  # no history record: told, not recorded
        record = event("held", self.model, start["candidate"], step=index, said=why, time=now)
        self._send(start, record, "held", held_seconds=held_s, max_hold_seconds=max_hold_s)

    def approved(self, start: dict, record: dict) -> None:
        if self.sender is not None:
            extra = {"reason": record.get("reason"), "approved_by": record.get("by")}
            self._send(start, record, "approved", **extra)

    def __enter__(self) -> Notifier:
        return self

    def __exit__(self, *exc) -> None:
        if self.sender is None or self.candidate is None:
            return
        tally = self.sender.close()
        self._record(tally)

    def _record(self, tally: Tally) -> None:
        fields = {"delivered": tally.delivered, "failed": tally.failed, **({"why": tally.why} if tally.why else {})}
        append_history(self.where.history, event(NOTIFIED, self.model, self.candidate, **fields))
        if tally.failed:
            log.warning("model %s: %d rollout notification(s) not delivered: %s", self.model, tally.failed, tally.why)

    def _send(self, start: dict, record: dict, name: str, **extra) -> None:
        look = self._last_look(start) if name != "started" else None
        self.sender.send(document(name, start, record, look, self.where) | extra)

    def _last_look(self, start: dict) -> dict | None:
        """The last look of this rollout (on resume, from the history: this controller has made none yet)."""
        if self.look is None:
            mine = [e for e in read_history(self.where.history) if _of(e, start)]
            self.look = next((e for e in reversed(mine) if e["event"] == CHECK), None)
        return self.look if self.look is not None and _of(self.look, start) else None


def notifier(config: RolloutConfig, history: Path, model: str) -> Notifier:
    """The rollout's notifier: --notify's receivers, each in its format or --notify-format."""
    where = Where(history, config.notify_link)
    if not config.notify:
        return Notifier(model, where, None)
    return Notifier(model, where, Sender(config.notify, lambda r, d: render(r, d, config.notify_format)))


def _of(record: dict, start: dict) -> bool:
    return (
        record.get("action") == ROLLOUT
        and record.get("model") == start["model"]
        and record.get("candidate") == start["candidate"]
    )


def document(name: str, start: dict, record: dict, look: dict | None, where: Where) -> dict:
    """The generic document (SCHEMA) of one decision."""
    step = _step(start["plan"], record.get("step"), name)
    said = record.get("said")
    return {
        "schema": SCHEMA,
        "event": name,
        "summary": summary(name, start, step, said, record),
        "time": record.get("time"),
        "started": start.get("time"),
        "model": start["model"],
        "candidate": start["candidate"],
        "stable": start["stable"],
        "plan": start["plan"],
        "step": step,
        "said": said,
        "look": look and {k: look.get(k) for k in ("step", "decision", "checks", "counts")},
        "report": where.report(start),
        "history": str(where.history),
        "by": record.get("by"),
        "bake_seconds": float((start.get("bake") or {}).get("seconds") or 0.0),  # the rollout ends after it
    }


def _step(plan_text: str, index: int | None, name: str) -> dict | None:
    plan = parse_plan(plan_text)
    if name == "promoted":
        index = len(plan.steps) - 1
    if index is None:
        return None
    return {
        "index": index,
        "number": index + 1,
        "of": len(plan.steps),
        "words": plan.steps[index].words(),
        "shadow_percent": plan.shadow_during(index),
        "canary_percent": plan.canary_during(index),
    }


def summary(name: str, start: dict, step: dict | None, said: str | None, record: dict) -> str:
    """The decision in one sentence."""
    who = f"model {start['model']} version {start['candidate']}"
    at = f"step {step['number']} of {step['of']} ({step['words']})" if step else "before its first step"
    if step and step["number"] == step["of"] and name == "rolled-back":  # after the promotion: the bake
        at = "the bake after its promotion (stable back to previous)"
    return {
        "started": f"rollout of {who} begun (stable {start['stable']}): {start['plan']}",
        "step": f"{who}: {at} entered",
        "held": f"{who}: {at} inconclusive, pauses at --max-hold: {said}",
        "awaiting-approval": f"{who}: waiting for approval before {at} (`trainserve rollout --approve --reason "
        "TEXT`), no canary share meanwhile",
        "approved": f"{who}: approved by {record.get('by')}: {record.get('reason')}",
        "paused": f"{who} paused at {at}: {said}; run the same command to resume, or --abort --reason TEXT",
        "rolled-back": f"{who} rolled back at {at}: {said}",
        "promoted": f"{who} promoted: stable -> {start['candidate']}",
        "bake": f"{who}: {record.get('words')} begun, previous version {record.get('previous')} kept loaded",
        "baked": f"{who}: bake ended, version kept as stable: {said}",
    }[name]


def render(receiver: Receiver, document: dict, default: str = "generic") -> bytes:
    """The body `receiver` gets for `document`."""
    kind = receiver.format or default
    return json.dumps(alertmanager(document) if kind == "alertmanager" else document, sort_keys=True).encode()


def alertmanager(document: dict) -> dict:
    """Alertmanager's webhook body (version 4) for one generic document: the rollout as one alert."""
    labels = {
        "alertname": ALERT,
        "model": document["model"],
        "candidate": str(document["candidate"]),
        "stable": str(document["stable"]),
    }
    baking = document["event"] == "promoted" and document.get("bake_seconds")  # the bake to come
    status = "resolved" if document["event"] in ENDS and not baking else "firing"
    annotations = {
        "event": document["event"],
        "summary": document["summary"],
        "description": document["said"] or document["summary"],
        "step": document["step"]["words"] if document["step"] else "",
        "report": document["report"],
    }
    alert = {
        "status": status,
        "labels": labels,
        "annotations": annotations,
        "startsAt": document["started"],
        "endsAt": document["time"] if status == "resolved" else NO_END,
        "generatorURL": document["report"],
        "fingerprint": fingerprint(labels),
    }
    group = {"alertname": ALERT, "model": document["model"]}
    return {
        "version": "4",
        "groupKey": "{}:{" + ", ".join(f'{k}="{v}"' for k, v in group.items()) + "}",
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "trainserve-rollout",
        "groupLabels": group,
        "commonLabels": labels,
        "commonAnnotations": annotations,
        "externalURL": "",
        "alerts": [alert],
    }


def fingerprint(labels: dict[str, str]) -> str:
    """Alertmanager's fingerprint of a label set: FNV-1a 64 over the sorted names and values, each followed by
    byte 255, in 16 hex digits (prometheus/common model.LabelSet.Fingerprint)."""
    value = 0xCBF29CE484222325
    for name in sorted(labels):
        for part in (name, labels[name]):
            for byte in (*part.encode(), 255):
                value = ((value ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{value:016x}"
