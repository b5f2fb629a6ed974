"""`trainserve live-eval-merge`: the reports of `live-eval --shard I/N` clients as the report one client would
have written. Shards split the capture by request id, so every version's answers to one request, and its labels,
are in one shard: counts, pairs and duplicates add exactly, and the intervals, estimates and gates are computed
again from the sums."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trainserve.errors import TrainserveError
from trainserve.live.calibration import Calibration
from trainserve.live.report import build_report, config_of
from trainserve.live.tally import SUMS, VersionTally, known_sums
from trainserve.task import Task
from trainserve.traffic.reader import ReadSummary

PAIR_COUNTS = ("examples", "first_only", "second_only", "both_right")


@dataclass
class MergedLabels:
    counts_: dict
    has_row_column: bool

    def counts(self) -> dict:
        return {k: v for k, v in self.counts_.items() if k != "path"}


@dataclass
class Merged:
    """The shards' sums, with what build_report reads of a join.Joined."""

    task: Task
    labels: MergedLabels
    missing: int
    pairs_: list[dict]
    before_since: int = 0
    since_s: int | None = None
    versions: dict[int, VersionTally] = field(default_factory=dict)
    estimate_notes: dict[int, str] = field(default_factory=dict)
    read: ReadSummary = field(default_factory=ReadSummary)

    def labelled_not_captured(self) -> int:
        return self.missing

    def pairs(self) -> list[dict]:
        return self.pairs_


def merge_reports(reports: list[dict], sources: list[str]) -> dict:
    _check_shards(reports, sources)
    first = reports[0]
    merged = Merged(
        Task.from_json(first["task"]),
        MergedLabels(_sum_labels(reports), first["join"]["key"].endswith("within the request")),
        sum(r["join"]["labelled_not_captured"] for r in reports),
        _sum_pairs(reports),
        sum(r["join"]["records_before_since"] for r in reports),
        first["join"]["since_s"],
    )
    for report in reports:
        for section in report["versions"]:
            _add_version(merged, section)
    c = first["capture"]
    merged.read = ReadSummary(
        files=c["files"],
        records=c["records"],
        kept=sum(r["capture"]["kept"] for r in reports),
        other_models=Counter(c["other_models"]),
        skipped=c["skipped_records"],
        skipped_bytes=c["skipped_bytes"],
        damage=list(c["damage"]),
    )
    config = config_of(first)
    report = build_report(config, [Path(p) for p in c["paths"]], merged)
    report["merged"] = {"shards": len(reports), "sources": sources}
    return report


def _check_shards(reports: list[dict], sources: list[str]) -> None:
    shards = sorted(r["capture"]["shard"] or "" for r in reports)
    counts = {s.partition("/")[2] for s in shards}
    if len(counts) != 1 or not shards[0] or len(set(shards)) != len(shards) or len(shards) != int(counts.pop()):
        raise TrainserveError(f"shards {', '.join(shards)}: expected every shard I/N of one live-eval run, once each")
    run = {(r["model"], str(r["settings"]), r["labels"]["path"], str(r["capture"]["paths"])) for r in reports}
    if len(run) != 1:
        raise TrainserveError(
            f"{', '.join(sources)}: expected shards of one live-eval run (one model, capture, labels file and settings)"
        )


def _sum_labels(reports: list[dict]) -> dict:
    total = {"rows": 0, "labels": 0, "duplicate_rows": 0, "conflicting_examples": 0}
    bad: Counter = Counter()
    for r in reports:
        for key in total:
            total[key] += r["labels"][key]
        bad.update(r["labels"]["bad_rows"])
    return total | {"bad_rows": {k: bad.get(k, 0) for k in reports[0]["labels"]["bad_rows"]}}


def _sum_pairs(reports: list[dict]) -> list[dict]:
    sums: dict[tuple, dict] = {}
    for r in reports:
        for pair in r["pairs"]:
            key = tuple(pair["versions"])
            into = sums.setdefault(key, {"versions": list(key), **dict.fromkeys(PAIR_COUNTS, 0)})
            for field_name in PAIR_COUNTS:
                into[field_name] += pair[field_name]
            for kind, added in pair.get("differences", {}).items():  # regression: paired error differences
                total = into.setdefault("differences", {}).setdefault(kind, dict.fromkeys(SUMS, 0.0))
                for name in SUMS:
                    total[name] += added.get(name, math.nan)  # no fourth-power sum: an older report
    for pair in sums.values():
        for kind, total in pair.get("differences", {}).items():
            pair["differences"][kind] = known_sums([total[name] for name in SUMS])
    return [sums[k] for k in sorted(sums)]


def _add_version(merged: Merged, section: dict) -> None:
    v = section["version"]
    side = merged.versions.get(v)
    if side is None:
        cal = section["calibration"]
        calibration = None if cal is None else Calibration.from_json(cal)
        side = merged.versions[v] = VersionTally(v, merged.task.classes, calibration, merged.task.kind == "regression")
        if section["estimate_note"]:
            merged.estimate_notes[v] = section["estimate_note"]
    side.records += section["records"]
    side.overall.merge(section["overall"])
    side.confusion += np.asarray(section["confusion_matrix"], np.int64)
    for w in section["windows"]:
        side.window(w["start"]).merge(w)
    for column, cells in section["slices"].items():
        for cell in cells:
            side.slice_cell(column, cell["value"]).merge(cell)
