"""Prometheus' text exposition format (prometheus.io/docs/instrumenting/exposition_formats), for the pages
serve-local, the proxy and the capture writers serve: label values escape backslash, double quote and line
feed; HELP text backslash and line feed. TF Serving's exporter (util/prometheus_exporter.cc) escapes only the first
two. Shared by the stages that serve a metrics page, so one histogram and one escaping rule serve them all."""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field

CONTENT_TYPE = "text/plain; version=0.0.4"
LATENCY_BUCKETS = tuple(
    10 * 1.8**i for i in range(33)
)  # TF Serving's request latency: Buckets::Exponential(10, 1.8, 33)
UNKNOWN_MODEL = "<unknown>"  # the model_name of calls for a model no one serves: one series for all of them

_LABEL_VALUE_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"', "\n": "\\n"})
_HELP_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n"})


def label_set(names: tuple[str, ...], values: tuple, extra: str = "") -> str:
    """`{name="value",...}` (empty when there are no labels); `extra` is a label already written, such as `le`."""
    parts = [f'{n}="{str(v).translate(_LABEL_VALUE_ESCAPES)}"' for n, v in zip(names, values)]
    parts += [extra] if extra else []
    return "{" + ",".join(parts) + "}" if parts else ""


def header(name: str, kind: str, help_text: str) -> list[str]:
    """The HELP and TYPE lines of a metric family."""
    return [f"# HELP {name} {help_text.translate(_HELP_ESCAPES)}", f"# TYPE {name} {kind}"]


@dataclass
class Histogram:
    """A Prometheus histogram per label values: cumulative buckets, sum and count; threads observe concurrently."""

    name: str
    help_text: str
    label_names: tuple[str, ...]
    bounds: tuple[float, ...] = LATENCY_BUCKETS
    _cells: dict[tuple, list] = field(default_factory=dict, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def observe(self, value: float, *labels: str) -> None:
        with self._lock:
            cell = self._cells.setdefault(labels, [[0] * (len(self.bounds) + 1), 0.0])
            cell[0][bisect.bisect_left(self.bounds, value)] += 1
            cell[1] += value

    def lines(self) -> list[str]:
        with self._lock:
            cells = sorted((labels, list(counts), total) for labels, (counts, total) in self._cells.items())
        out = header(self.name, "histogram", self.help_text)
        for labels, counts, total in cells:
            running = 0
            for bound, count in zip((*self.bounds, float("inf")), counts):
                running += count
                le = 'le="+Inf"' if bound == float("inf") else f'le="{bound:g}"'
                out.append(f"{self.name}_bucket{label_set(self.label_names, labels, le)} {running}")
            # Every digit (TF Serving rounds to 6): a rounded sum moves in steps, and rate() with it.
            out.append(f"{self.name}_sum{label_set(self.label_names, labels)} {total!r}")
            out.append(f"{self.name}_count{label_set(self.label_names, labels)} {running}")
        return out
