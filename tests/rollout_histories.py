"""Rollout histories written record by record, as the controller writes them (trainserve.rollout.progress), with
each look's checks judged by the controller's own code on the counts a test gives: what the decision report reads
without a Prometheus or a controller run."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from trainserve.rollout import analysis
from trainserve.rollout.measure import KEYS
from trainserve.rollout.plan import parse_plan
from trainserve.rollout.progress import CHECK, START, STEP, event
from trainserve.rollout.rollout_config import StepGate

PLAN = "shadow 1s, 25% 1s, 100%"
GATE = StepGate(min_requests=20)
OFFLINE = {"disagreement": {"source": "eval", "candidate": 2, "baseline": 1, "count": 3, "examples": 100}}


class History:
    """One history file: `add(kind, **fields)` appends a record of model `model`'s rollout of version 2, its time
    the next second."""

    def __init__(self, path: Path, model: str = "m"):
        self.path, self.model, self.second = path, model, 0

    def add(self, kind: str, **fields) -> dict:
        self.second += 1
        record = {"time": f"2026-12-01T17:00:{self.second:02d}Z", "by": "sre@host", **event(kind, self.model, 2)}
        record.update(fields)
        with self.path.open("a") as out:
            out.write(json.dumps(record) + "\n")
        return record

    def start(self, report: str = "candidate.json") -> dict:
        return self.add(
            START,
            plan=parse_plan(PLAN).text(),
            stable=1,
            flips=True,
            report=report,
            report_sha256="0" * 64,
            offline=OFFLINE,
            gate=asdict(GATE),
            routing_file="routing.json",
        )

    def step(self, index: int, seen: dict | None = None) -> dict:
        words = parse_plan(PLAN).steps[index].words()
        counters = {"le": None, "seen": seen or {}, "counts": {}}
        return self.add(STEP, step=index, words=words, started=0.0, counters=counters)

    def look(self, index: int, ended: bool = False, state: dict | None = None, **counted) -> dict:
        """A look at step `index` on `counted` (the rest 0), judged and decided as the controller does."""
        counts = {key: 0 for key in KEYS} | counted
        found = analysis.checks(parse_plan(PLAN).steps[index], True, counts, GATE, OFFLINE)
        extra = {"state": state} if state else {}
        return self.add(
            CHECK,
            step=index,
            counts=counts,
            checks=[asdict(c) for c in found],
            decision=analysis.decide(found, ended),
            **extra,
        )


# Counts at each step that judge every check: a shadow step whose flips pass, a canary step whose errors fail.
SHADOW_PASSES = {"shadow_compared": 4000, "shadow_classified": 3200, "shadow_pairs": 3200, "shadow_flips": 3}
CANARY_FAILS = {
    **SHADOW_PASSES,
    "canary_requests": 400,
    "canary_errors": 80,
    "stable_requests": 1200,
    "stable_errors": 1,
    "candidate_latency_count": 400,
    "stable_latency_count": 1200,
    "stable_slow": 12,
}
