"""`trainserve replay-merge`: the reports of `replay --shard I/N` clients as the report one client would have
written. Counts, the flip matrix and the histograms add exactly; the flip rate, its bound and the distributions
are derived again from the sums. Latency percentiles come from histograms in either case (bins 2 % wide)."""

from __future__ import annotations

from trainserve.errors import TrainserveError
from trainserve.replay.report import build_report
from trainserve.replay.tally import ReplayTally

SAME = ("model", "signature", "output", "task", "candidate", "baseline", "server")


def merge_reports(reports: list[dict], sources: list[str]) -> dict:
    first = reports[0]
    for report, source in zip(reports[1:], sources[1:]):
        differing = [k for k in SAME if report[k] != first[k]]
        if differing:
            raise TrainserveError(
                f"{source} differs from {sources[0]} in {', '.join(differing)}: expected shards of one replay"
            )
    shards = sorted(r["capture"]["shard"] or "" for r in reports)
    counts = {s.partition("/")[2] for s in shards}
    if len(counts) != 1 or not shards[0] or len(set(shards)) != len(shards) or len(shards) != int(counts.pop()):
        raise TrainserveError(f"shards {', '.join(shards)}: expected every shard I/N of one replay, once each")
    tally = ReplayTally.from_state(first["tally"])
    for report in reports[1:]:
        tally.merge(ReplayTally.from_state(report["tally"]))
    head = {k: first[k] for k in (*SAME, "class_names")}
    head["class_names"] = next((r["class_names"] for r in reports if r["class_names"]), [])
    head["capture"] = _capture(reports)
    limits = [r["settings"].get("limit") for r in reports]
    settings = first["settings"] | {"limit": next((n for n in limits if n is not None), None)}
    merged = build_report(head, tally, settings)
    merged["merged"] = {
        "shards": len(reports),
        "sources": sources,
        "precision": "exact counts; latency percentiles from 2 %-wide histogram bins",
    }
    return merged


def _capture(reports: list[dict]) -> dict:
    caps = [r["capture"] for r in reports]
    other: dict[str, int] = {}
    for cap in caps:
        for name, n in cap["other_models"].items():
            other[name] = other.get(name, 0) + n
    return {
        "paths": caps[0]["paths"],
        "files": caps[0]["files"],
        "records": caps[0]["records"],  # every shard reads every record; each keeps its own
        "kept": sum(c["kept"] for c in caps),
        "other_models": {k: v // len(caps) for k, v in other.items()},
        "skipped_records": caps[0]["skipped_records"],
        "skipped_bytes": caps[0]["skipped_bytes"],
        "damage": caps[0]["damage"],
        # Each shard read its own snapshot: the most any of them left out.
        "after_start": max((c["after_start"] for c in caps), key=lambda a: (a["records"], a["files_gone"])),
        "shard": None,
        "other_signature": sum(c.get("other_signature", 0) for c in caps),
    }
