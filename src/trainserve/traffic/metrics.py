"""What capture writers did, as Prometheus counters (text exposition format), for serve-local's metrics page and
the capture proxy's: records written, and records dropped by reason, per filename_prefix."""

from __future__ import annotations

from trainserve.traffic.writer import DROP_REASONS, TrafficWriter

WRITTEN = ":trainserve:capture:records_written"
DROPPED = ":trainserve:capture:records_dropped"
_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"', "\n": "\\n"})


def _label(name: str, value: str) -> str:
    return f'{name}="{value.translate(_ESCAPES)}"'


def writer_lines(writers: dict[str, TrafficWriter]) -> list[str]:
    """Both counters for each writer, keyed by its filename_prefix, sorted so that scrapes are stable."""
    lines = [f"# HELP {WRITTEN} Captured Predict calls written.", f"# TYPE {WRITTEN} counter"]
    lines += [f"{WRITTEN}{{{_label('filename_prefix', p)}}} {w.written}" for p, w in sorted(writers.items())]
    lines += [f"# HELP {DROPPED} Sampled Predict calls not written, by reason.", f"# TYPE {DROPPED} counter"]
    for prefix, writer in sorted(writers.items()):
        for reason in DROP_REASONS:
            labels = f"{_label('filename_prefix', prefix)},{_label('reason', reason)}"
            lines.append(f"{DROPPED}{{{labels}}} {writer.dropped[reason]}")
    return lines
