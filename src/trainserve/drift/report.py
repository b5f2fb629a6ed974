"""The drift report: JSON following drift_report.schema.json (`trainserve.drift/1`), the sorted table for the
terminal, and which features drifted past the thresholds."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from trainserve import __version__
from trainserve.drift.config import DriftConfig
from trainserve.drift.run import VersionTraffic, compare_version
from trainserve.files import write_file_atomic
from trainserve.traffic.reader import ReadSummary

SCHEMA_ID = "trainserve.drift/1"
SCHEMA_PATH = Path(__file__).with_name("drift_report.schema.json")


def build_report(
    config: DriftConfig, captures: list[Path], versions: dict[int, VersionTraffic], read: ReadSummary
) -> dict:
    sections, drifted = [], []
    for version, side in sorted(versions.items()):
        rows = compare_version(side)
        for row in rows:
            reasons = []
            if row["psi"] > config.max_psi:
                reasons.append(f"PSI {row['psi']:.3f} > {config.max_psi:g}")
            if row["unseen_share"] is not None and row["unseen_share"] > config.max_unseen_share:
                reasons.append(f"unseen categories {row['unseen_share']:.1%} > {config.max_unseen_share:.1%}")
            row["drifted"] = bool(reasons)
            if reasons:
                drifted.append({"version": version, "feature": row["feature"], "said": "; ".join(reasons)})
        sections.append(
            {
                "version": version,
                "records": side.records,
                "examples": side.examples,
                "training_examples": side.profile.get("examples"),
                "features": rows,
                "uncompared_inputs": sorted(side.uncompared),
                "traffic_counts": side.counts,
            }
        )
    return {
        "schema": SCHEMA_ID,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "trainserve": __version__,
        "model": config.model,
        "data_dir": str(config.data_dir),
        "capture": read.as_dict()
        | {
            "paths": [str(p) for p in captures],
            "shard": config.shard.describe() if config.shard else None,
        },
        "thresholds": {"max_psi": config.max_psi, "max_unseen_share": config.max_unseen_share},
        "versions": sections,
        "drifted": drifted,
        "passed": not drifted,
    }


def validate_report(report: dict) -> None:
    """Raise jsonschema.ValidationError when a report does not follow drift_report.schema.json."""
    from trainserve.evidence.document import validate_report as validate

    validate(report, SCHEMA_PATH)


def write_report(report: dict, path: Path) -> Path:
    return write_file_atomic(path, (json.dumps(report, indent=2) + "\n").encode())


def drift_table(report: dict) -> str:
    lines = []
    for section in report["versions"]:
        lines.append(
            f"drift {report['model']} v{section['version']}: {section['records']} captured requests, "
            f"{section['examples']} examples, against {section['training_examples']} training examples"
        )
        lines.append(f"  {'feature':<28} {'kind':<11} {'PSI':>8} {'JS dist':>8} {'unseen':>8} {'mean shift':>11}")
        for r in section["features"]:
            unseen = "" if r["unseen_share"] is None else f"{r['unseen_share']:.1%}"
            shift = f"{r['mean_shift_sd']:+.2f} sd" if r["kind"] == "numeric" else ""
            mark = "  DRIFT" if r["drifted"] else ""
            lines.append(
                f"  {r['feature'][:28]:<28} {r['kind']:<11} {r['psi']:>8.4f} {r['js_distance']:>8.4f} "
                f"{unseen:>8} {shift:>11}{mark}"
            )
        if section["uncompared_inputs"]:
            lines.append(f"  not in the training profile: {', '.join(section['uncompared_inputs'])}")
    return "\n".join(lines)
