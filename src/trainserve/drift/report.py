"""The drift report: JSON following drift_report.schema.json (`trainserve.drift/2`), the sorted table for the
terminal, and which features drifted past the thresholds."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from trainserve import __version__
from trainserve.drift.compare import judge
from trainserve.drift.config import DriftConfig
from trainserve.drift.run import CountedTraffic, compare_version
from trainserve.files import write_file_atomic
from trainserve.stats.divergence import NOISE_ALPHA

SCHEMA_ID = "trainserve.drift/2"
SCHEMA_PATH = Path(__file__).with_name("drift_report.schema.json")


def build_report(config: DriftConfig, captures: list[Path], counted: CountedTraffic) -> dict:
    sections, drifted = [], []
    for version, side in sorted(counted.versions.items()):
        rows = compare_version(side)
        for row in rows:
            reasons = judge(row, config.max_psi, config.max_unseen_share)
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
        "capture": counted.read.as_dict()
        | {
            "paths": [str(p) for p in captures],
            "shard": config.shard.describe() if config.shard else None,
            "limit": config.limit,
        },
        "thresholds": {
            "max_psi": config.max_psi,
            "max_unseen_share": config.max_unseen_share,
            "noise_alpha": NOISE_ALPHA,
        },
        "versions": sections,
        "unprofiled_versions": [u.as_dict() for _, u in sorted(counted.unprofiled.items())],
        "drifted": drifted,
        "passed": not drifted,
    }


def unprofiled_lines(report: dict) -> list[str]:
    """One line per version left out for want of a training profile."""
    return [
        f"v{u['version']}: {u['records']} captured requests not compared: no data profile ({u['profile']})"
        for u in report["unprofiled_versions"]
    ]


def validate_report(report: dict) -> None:
    """Raise jsonschema.ValidationError when a report does not follow drift_report.schema.json."""
    from trainserve.evidence.document import validate_report as validate

    validate(report, SCHEMA_PATH)


def write_report(report: dict, path: Path) -> Path:
    return write_file_atomic(path, (json.dumps(report, indent=2, allow_nan=False) + "\n").encode())


def drift_table(report: dict) -> str:
    lines = []
    for section in report["versions"]:
        lines.append(
            f"drift {report['model']} v{section['version']}: {section['records']} captured requests, "
            f"{section['examples']} examples, against {section['training_examples']} training examples"
        )
        lines.append(
            f"  {'feature':<28} {'kind':<11} {'PSI':>8} {'noise':>7} {'JS dist':>8} {'unseen':>8} {'mean shift':>11} "
            f"{'NaN/inf':>9}  verdict"
        )
        for r in section["features"]:
            lines.append(
                f"  {r['feature'][:28]:<28} {r['kind']:<11} {_number(r['psi'], '.4f'):>8} "
                f"{_number((r['noise'] or {}).get('psi'), '.3f'):>7} {_number(r['js_distance'], '.4f'):>8} "
                f"{_number(r['unseen_share'], '.1%'):>8} {_shift(r):>11} {non_finite_said(r):>9}  {verdict_said(r)}"
            )
        if section["uncompared_inputs"]:
            lines.append(f"  not in the training profile: {', '.join(section['uncompared_inputs'])}")
    lines += unprofiled_lines(report)
    return "\n".join(lines)


def non_finite_said(row: dict) -> str:
    """The traffic's NaN and infinite values, `NaN/inf` (blank for categories)."""
    if row["non_finite"] is None:
        return ""
    traffic = row["non_finite"]["traffic"]
    return f"{traffic['nan']}/{traffic['infinite']}"


def _number(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


def _shift(row: dict) -> str:
    value = row.get("mean_shift_sd")
    return "" if value is None else f"{value:+.2f} sd"


def verdict_said(row: dict) -> str:
    """The row's verdict as the table and the page say it."""
    return {"drifted": "DRIFT", "stable": "stable", "too few": "too few to tell"}[row["verdict"]]
