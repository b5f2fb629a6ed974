"""What capture writers did, as Prometheus counters (text exposition format), for serve-local's metrics page and
the proxy's, per filename_prefix: records offered, written, dropped and lost by reason (these add up:
offered = written + dropped + lost + pending), written records deleted since (by reason), and calls skipped."""

from __future__ import annotations

from trainserve.exposition import header, label_set
from trainserve.traffic.accounting import Accounting
from trainserve.traffic.writer import TrafficWriter

_BASE = ":trainserve:capture:"
OFFERED = _BASE + "records_offered"
WRITTEN = _BASE + "records_written"
DROPPED = _BASE + "records_dropped"
LOST = _BASE + "records_lost"
PENDING = _BASE + "records_pending"
DELETED = _BASE + "records_deleted"
SKIPPED = _BASE + "calls_skipped"

# name, type, help, and how to read it from an Accounting: an int, or a dict of counts by reason
_SERIES = (
    (OFFERED, "counter", "Sampled Predict calls offered to the capture.", lambda a: a.offered),
    (WRITTEN, "counter", "Captured Predict calls written.", lambda a: a.written),
    (DROPPED, "counter", "Sampled Predict calls not written, by reason.", lambda a: a.dropped),
    (LOST, "counter", "Records accepted and then not kept, by reason.", lambda a: a.lost),
    (PENDING, "gauge", "Records queued or being written.", lambda a: a.pending),
    (DELETED, "counter", "Written records removed from the disk since, by reason.", lambda a: a.deleted),
    (SKIPPED, "counter", "Predict calls not offered (trainserve's own calls: reason origin).", lambda a: a.skipped),
)


def writer_lines(writers: dict[str, TrafficWriter]) -> list[str]:
    """Every series for each writer, keyed by its filename_prefix, sorted so that scrapes are stable; each
    writer's counts are read once, so they add up within a scrape."""
    counts: dict[str, Accounting] = {prefix: writers[prefix].accounting() for prefix in sorted(writers)}
    lines = []
    for name, kind, text, read in _SERIES:
        lines += header(name, kind, text)
        for prefix, accounting in counts.items():
            value = read(accounting)
            if isinstance(value, dict):
                lines += [
                    f"{name}{label_set(('filename_prefix', 'reason'), (prefix, r))} {n}" for r, n in value.items()
                ]
            else:
                lines.append(f"{name}{label_set(('filename_prefix',), (prefix,))} {value}")
    return lines
