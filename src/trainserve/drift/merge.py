"""`trainserve drift-merge`: the reports of `drift --shard I/N` clients as the report one client would have
written. The traffic counts (per version, per feature, in the training's bins) add exactly; the effect sizes are
computed again from the sums, against the same training profiles."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from trainserve.data_profile import add_counts
from trainserve.drift.config import DriftConfig
from trainserve.drift.report import build_report
from trainserve.drift.run import CountedTraffic, VersionTraffic
from trainserve.errors import TrainserveError
from trainserve.traffic.reader import ReadSummary


def merge_reports(reports: list[dict], sources: list[str], data_dir: Path | None) -> dict:
    first = reports[0]
    shards = sorted(r["capture"]["shard"] or "" for r in reports)
    counts = {s.partition("/")[2] for s in shards}
    if len(counts) != 1 or not shards[0] or len(set(shards)) != len(shards) or len(shards) != int(counts.pop()):
        raise TrainserveError(f"shards {', '.join(shards)}: expected every shard I/N of one drift run, once each")
    if any(_run_of(r) != _run_of(first) for r in reports):
        raise TrainserveError(
            f"{', '.join(sources)}: expected shards of one drift run (one model, one set of thresholds, one --limit)"
        )
    data_dir = Path(data_dir or first["data_dir"])
    t = first["thresholds"]
    config = DriftConfig(first["model"], data_dir, t["max_psi"], t["max_unseen_share"], limit=first["capture"]["limit"])
    counted = CountedTraffic()
    for report in reports:
        for left_out in report["unprofiled_versions"]:
            side = counted.side(data_dir, config.model, left_out["version"])
            if isinstance(side, VersionTraffic):
                raise TrainserveError(
                    f"a shard left out version {side.version} (no data profile then), {data_dir} has one now: "
                    "expected the shards and the merge to read one data dir (run the shards again)"
                )
            side.records += left_out["records"]
        for section in report["versions"]:
            side = counted.side(data_dir, config.model, section["version"])
            side.records += section["records"]
            if not isinstance(side, VersionTraffic):
                continue  # the shard's data dir had the profile, this one has not: left out, named
            side.examples += section["examples"]
            side.uncompared.update(section["uncompared_inputs"])
            add_counts(side.counts, section["traffic_counts"])
    counted.check_compared(data_dir, config.model)
    counted.read = ReadSummary(
        files=first["capture"]["files"],
        records=first["capture"]["records"],
        kept=sum(r["capture"]["kept"] for r in reports),
        other_models=Counter(first["capture"]["other_models"]),
        skipped=first["capture"]["skipped_records"],
        skipped_bytes=first["capture"]["skipped_bytes"],
        damage=list(first["capture"]["damage"]),
    )
    merged = build_report(config, [Path(p) for p in first["capture"]["paths"]], counted)
    merged["merged"] = {"shards": len(reports), "sources": sources}
    return merged


def _run_of(report: dict) -> tuple:
    """What every shard of one drift run shares."""
    return report["model"], report["thresholds"], report["capture"]["limit"]
