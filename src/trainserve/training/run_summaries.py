"""`trainserve runs LOGS...`: training runs side by side, from their `run_summary.json`.

The question it answers is the one users of this field keep asking: how does the same training compare
on a CPU and on a GPU (or with another strategy or precision)? A comparison is only fair on the same
data, so the table shows each run's data fingerprint and a warning says when they differ.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from trainserve.errors import TrainserveError

SUMMARY_FILE = "run_summary.json"


@dataclass(frozen=True)
class RunRow:
    """One run's line of the table."""

    name: str
    device: str
    strategy: str
    precision: str
    replicas: int
    examples_per_s: float
    epochs: int
    wall_s: float
    fingerprint: str
    metrics: dict[str, float] = field(default_factory=dict)


def read_run(path: Path) -> RunRow:
    """A logs directory (or its run_summary.json) as a table row; a one-line error when it is not one."""
    summary_path = path / SUMMARY_FILE if path.is_dir() else path
    try:
        summary = json.loads(summary_path.read_text())
        devices = summary["devices"]
        gpus = [g.get("device_name") or g.get("name", "GPU") for g in devices.get("gpus", [])]
        return RunRow(
            name=str(path),
            device=", ".join(sorted(set(gpus))) + (f" x{len(gpus)}" if len(gpus) > 1 else "") if gpus else "CPU",
            strategy=devices["strategy"],
            precision=summary["precision"],
            replicas=int(devices["replicas"]),
            examples_per_s=float(summary["train_examples_per_s"]),
            epochs=int(summary["epochs"]),
            wall_s=float(summary["duration_s"]),
            fingerprint=summary["data"]["fingerprint"],
            metrics={k: float(v) for k, v in summary.get("metrics", {}).items() if isinstance(v, int | float)},
        )
    except FileNotFoundError:
        raise TrainserveError(
            f"{summary_path} not found: expected a training logs directory with {SUMMARY_FILE}"
        ) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise TrainserveError(f"{summary_path} is not a trainserve run summary ({type(exc).__name__}: {exc})") from None


def fingerprint_warning(rows: list[RunRow]) -> str | None:
    """A warning when the runs were not trained and tested on the same data."""
    groups: dict[str, list[str]] = {}
    for row in rows:
        groups.setdefault(row.fingerprint, []).append(row.name)
    if len(groups) < 2:
        return None
    described = "; ".join(f"{fp[:12]}: {', '.join(names)}" for fp, names in groups.items())
    return f"warning: the runs used different data (fingerprints {described}): their metrics are not comparable"


def runs_table(rows: list[RunRow]) -> str:
    """Aligned columns: device and set-up, speed, then every held-out metric any run reports."""
    metric_names = sorted({name for row in rows for name in row.metrics})
    header = ["run", "device", "strategy", "precision", "replicas", "examples/s", "epochs", "wall s", "data"]
    lines = [header + metric_names]
    for row in rows:
        cells = [
            row.name,
            row.device,
            row.strategy,
            row.precision,
            str(row.replicas),
            f"{row.examples_per_s:,.0f}",
            str(row.epochs),
            f"{row.wall_s:.1f}",
            row.fingerprint[:12],
        ]
        lines.append(cells + [f"{row.metrics[m]:.4f}" if m in row.metrics else "-" for m in metric_names])
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in lines)
