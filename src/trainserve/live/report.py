"""The live-eval report: JSON following live_eval_report.schema.json (`trainserve.live-eval/1`), the table for the
terminal, the one-line warnings about the labels file, and the gates."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from trainserve import __version__
from trainserve.files import write_file_atomic
from trainserve.live.config import LiveEvalConfig
from trainserve.live.gates import judge_gates

SCHEMA_ID = "trainserve.live-eval/1"
SCHEMA_PATH = Path(__file__).with_name("live_eval_report.schema.json")
ESTIMATES = ("estimate", "estimate_labelled")
MOVED = "!"  # beside an estimate whose answers' confidences moved: its error is widened by the share that moved
TABLE_WINDOWS = 12  # the terminal shows each version's last windows; the report and the page hold them all


def settings(config: LiveEvalConfig) -> dict:
    """What every shard of one run shares (and a merge rebuilds the config from)."""
    return {
        "key": config.key,
        "row_column": config.row_column,
        "label_column": config.label_column,
        "window_s": config.window_s,
        "window": config.window,
        "since": config.since,
        "slices": list(config.slice),
        "min_accuracy": config.min_accuracy,
        "max_drop": config.max_drop,
        "version": config.version,
        "baseline_version": config.baseline_version,
        "inconclusive": config.inconclusive,
        "level": config.level,
        "max_ece": config.max_ece,
        "max_psi": config.max_psi,
        "model_base_path": None if config.model_base_path is None else str(config.model_base_path),
        "calibrations": None if config.calibrations is None else str(config.calibrations),
    }


def config_of(report: dict, data_dir: Path | None = None) -> LiveEvalConfig:
    s = report["settings"]
    return LiveEvalConfig(
        labels=Path(report["labels"]["path"]),
        key=s["key"],
        row_column=s["row_column"],
        label_column=s["label_column"],
        model=report["model"],
        data_dir=data_dir if data_dir is not None else (Path(report["data_dir"]) if report["data_dir"] else None),
        window=s["window"],
        since=s["since"],
        slice=tuple(s["slices"]),
        min_accuracy=s["min_accuracy"],
        max_drop=s["max_drop"],
        version=s["version"],
        baseline_version=s["baseline_version"],
        inconclusive=s["inconclusive"],
        level=s["level"],
        max_ece=s["max_ece"],
        max_psi=s["max_psi"],
        model_base_path=None if s["model_base_path"] is None else Path(s["model_base_path"]),
        calibrations=None if s.get("calibrations") is None else Path(s["calibrations"]),
    )


def build_report(config: LiveEvalConfig, captures: list[Path], joined) -> dict:
    """`joined`: a join.Joined, or a merge's sums with the same attributes."""
    label_names = list(joined.task.label_names) or [str(i) for i in range(joined.task.classes)]
    sections = {
        v: side.to_json(label_names, config.window_s, config.level, config.max_psi)
        | {"estimate_note": joined.estimate_notes.get(v)}
        for v, side in sorted(joined.versions.items())
    }
    pairs = joined.pairs()
    gates = judge_gates(config, sections, pairs)
    label_counts = joined.labels.counts() | {"path": str(config.labels)}
    return {
        "schema": SCHEMA_ID,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "trainserve": __version__,
        "model": config.model,
        "task": joined.task.to_json(),
        "data_dir": None if config.data_dir is None else str(config.data_dir),
        "capture": joined.read.as_dict()
        | {"paths": [str(p) for p in captures], "shard": config.shard.describe() if config.shard else None},
        "settings": settings(config),
        "labels": label_counts,
        "join": {
            "key": "request id (x-request-id) and row within the request"
            if joined.labels.has_row_column
            else "request id (x-request-id); every label is for row 0 of its request",
            "joined": sum(s["joined"] for s in sections.values()),
            "unlabelled": sum(s["unlabelled"] for s in sections.values()),
            "duplicates": sum(s["duplicates"] for s in sections.values()),
            "labelled_not_captured": joined.labelled_not_captured(),
            "since_s": joined.since_s,
            "records_before_since": joined.before_since,
        },
        "versions": list(sections.values()),
        "pairs": pairs,
        "gates": gates,
        "passed": all(g["passed"] for g in gates),
    }


def report_warnings(report: dict) -> list[str]:
    """One line per kind of labels-file row that was not scored (with its count), and per flagged estimate."""
    labels, lines = report["labels"], []
    for kind, count in labels["bad_rows"].items():
        if count:
            lines.append(f"{count} labels-file row(s) skipped: {kind}")
    if labels["duplicate_rows"]:
        lines.append(f"{labels['duplicate_rows']} labels-file row(s) repeat an example already labelled (counted once)")
    if labels["conflicting_examples"]:
        lines.append(f"{labels['conflicting_examples']} example(s) given different labels: not scored")
    missing = report["join"]["labelled_not_captured"]
    if missing:
        lines.append(f"{missing} label(s) match no captured answer (unknown id: not sampled, or another request's)")
    for section in report["versions"]:
        flagged = (section["calibration"] or {}).get("flagged")
        if flagged:
            lines.append(f"estimate flagged: {flagged}")
        moved = _moved_windows(section, report["settings"]["window"])
        if moved:
            lines.append(
                f"estimate flagged: version {section['version']}'s answers' confidences moved from its held-out "
                f"split's in {len(moved)} window(s) ({', '.join(moved[:3])}{', ...' if len(moved) > 3 else ''}): "
                "traffic its calibration has not seen; the stated error is widened by the share that moved"
            )
    return lines


def _moved_windows(section: dict, window: str) -> list[str]:
    """The windows whose estimate over every answer is flagged for moved confidences, with their PSI."""
    return [
        f"{window_label(w['start'], window)} PSI {w['estimate']['shift']['psi']:.2f}"
        for w in section["windows"]
        if w["estimate"] and w["estimate"]["shift"]["flagged"]
    ]


def window_label(start: int, window: str) -> str:
    """A window's start as the table and the page show it."""
    if window == "all":
        return "all"
    return datetime.datetime.fromtimestamp(start, datetime.UTC).strftime("%Y-%m-%d %H:%M")


def validate_report(report: dict) -> None:
    """Raise jsonschema.ValidationError when a report does not follow live_eval_report.schema.json."""
    from trainserve.evidence.document import validate_report as validate

    validate(report, SCHEMA_PATH)


def write_report(report: dict, path: Path) -> Path:
    return write_file_atomic(path, (json.dumps(report, indent=2, allow_nan=False) + "\n").encode())


def live_table(report: dict) -> str:
    """The version's row, then its windows': labelled + unlabelled + duplicates = the answers, in every row."""
    regression = report["task"]["kind"] == "regression"
    row = _error_row if regression else _row
    head = (
        f"{'mse':>10} {'interval':>23} {'mae':>10} {'interval':>23}"
        if regression
        else f"{'accuracy':>9} {'interval':>17} {'estimate, all':>16} {'on the labelled':>15}"
    )
    lines = [_joined_line(report), f"  {'':>16} {'labelled':>8} {'unlabelled':>10} {'dupl.':>5} {head}"]
    for s in report["versions"]:
        lines.append(row(f"v{s['version']}", s["overall"]))
        windows = s["windows"] if len(s["windows"]) > 1 else []
        if len(windows) > TABLE_WINDOWS:
            lines.append(f"    ... {len(windows) - TABLE_WINDOWS} earlier windows in the report")
        for w in windows[-TABLE_WINDOWS:]:
            lines.append(row(window_label(w["start"], "1d"), w))
    if regression:
        lines.append("  (a regression model: no label-free estimate; it needs class probabilities)")
    elif any(_flagged(c[k]) for s in report["versions"] for c in [s["overall"], *s["windows"]] for k in ESTIMATES):
        lines.append(f"  {MOVED}: the answers' confidences moved from the held-out split's (PSI beyond --max-psi)")
    for gate in report["gates"]:
        lines.append(f"gate {'PASS' if gate['passed'] else 'FAIL'}: {gate['said']}")
    return "\n".join(lines)


def _joined_line(report: dict) -> str:
    j = report["join"]
    return (
        f"live-eval {report['model']}: {j['joined']} answers joined to labels, {j['unlabelled']} unlabelled, "
        f"{j['duplicates']} duplicate answers, {j['labelled_not_captured']} labels without a captured answer "
        f"(join on {j['key']})"
    )


def _counts(name: str, cell: dict) -> str:
    return f"  {name:>16} {cell['examples']:>8} {cell['unlabelled']:>10} {cell['duplicates']:>5}"


def _error_row(name: str, cell: dict) -> str:
    said = []
    for metric in ("mse", "mae"):
        ends = cell[f"{metric}_interval"]
        said.append("" if cell[metric] is None else f"{cell[metric]:.4g}")
        said.append("" if ends is None else f"[{ends[0]:.4g}, {ends[1]:.4g}]")
    return f"{_counts(name, cell)} {said[0]:>10} {said[1]:>23} {said[2]:>10} {said[3]:>23}"


def _row(name: str, cell: dict) -> str:
    """One line: the realised accuracy, the estimate over every answer, and over the labelled ones (beside the
    realised accuracy: the estimate's own error shows)."""
    accuracy = "" if cell["accuracy"] is None else f"{cell['accuracy']:.4f}"
    interval = "" if cell["interval"] is None else f"[{cell['interval'][0]:.3f}, {cell['interval'][1]:.3f}]"
    every, labelled = (_estimate(cell[k]) for k in ESTIMATES)
    return f"{_counts(name, cell)} {accuracy:>9} {interval:>17} {every:>16} {labelled:>15}"


def _estimate(said: dict | None) -> str:
    return "" if said is None else f"{said['value']:.4f} ±{said['error']:.3f}{MOVED if _flagged(said) else ''}"


def _flagged(said: dict | None) -> bool:
    return bool(said and said["shift"]["flagged"])
