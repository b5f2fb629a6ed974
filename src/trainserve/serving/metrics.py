"""Prometheus metrics in the text exposition format, served on the REST port when
`--monitoring_config_file` enables them (config/monitoring_config.proto).

Names are TF Serving's, as its Prometheus exporter writes them (`/` becomes `:`), so dashboards built on
the real server read serve-local too:
- `:tensorflow:serving:request_count` and `:tensorflow:serving:request_latency` (microseconds, labels
  model_name, API, entrypoint; buckets 10 x 1.8^i, i < 33), from servables/tensorflow/util.cc;
- with batching, `:tensorflow:serving:batching_session:{input_batch_size,processed_batch_size,padding_size}`
  from batching/batching_session.cc (TF Serving samples these as percentiles; here they are histograms).
Our request_count keeps an `api` label TF Serving's lacks; `available_versions` and `version_state` (one
series per version, labelled with its state and error code) are serve-local's own. Both request metrics carry a
`version` label TF Serving has none of (tensorflow/serving#1970): the version a request was answered by, so a
canary's errors and latency are seen apart from stable's; "" when no version was resolved (an unknown model or
version, a status call), which Prometheus stores as the label being absent.

The page follows the text exposition format (prometheus.io/docs/instrumenting/exposition_formats): label
values escape backslash, double quote and line feed, HELP text backslash and line feed. TF Serving's exporter
(util/prometheus_exporter.cc) escapes only the first two, and labels request_count with whatever name a
request asked for; here a name no configured model has is counted as UNKNOWN_MODEL, so clients cannot grow
the page without bound.
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from dataclasses import dataclass, field

from trainserve.serving.manager import ModelManager, State

CONTENT_TYPE = "text/plain; version=0.0.4"
PREFIX = ":tensorflow:serving"
LATENCY_BUCKETS = tuple(10 * 1.8**i for i in range(33))  # Buckets::Exponential(10, 1.8, 33)
BATCH_BUCKETS = tuple(2.0**i for i in range(15))  # 1 .. 16384 rows
# The model_name of requests for a model that is not configured: one series for all of them.
UNKNOWN_MODEL = "<unknown>"

_LABEL_VALUE_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"', "\n": "\\n"})
_HELP_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n"})


def _labels(names: tuple[str, ...], values: tuple[str, ...], extra: str = "") -> str:
    parts = [f'{n}="{v.translate(_LABEL_VALUE_ESCAPES)}"' for n, v in zip(names, values)] + ([extra] if extra else [])
    return "{" + ",".join(parts) + "}" if parts else ""


def _header(name: str, kind: str, help_text: str) -> list[str]:
    return [f"# HELP {name} {help_text.translate(_HELP_ESCAPES)}", f"# TYPE {name} {kind}"]


class RequestCounter:
    """Finished requests by (model name, version, API, gRPC status name); request threads add concurrently."""

    LABELS = ("model_name", "version", "api", "status")

    def __init__(self) -> None:
        self._counts: Counter[tuple[str, str, str, str]] = Counter()
        self._lock = threading.Lock()

    def add(self, model_name: str, version: str, api: str, status: str) -> None:
        with self._lock:
            self._counts[(model_name, version, api, status)] += 1

    def snapshot(self) -> list[tuple[tuple[str, str, str, str], int]]:
        """The counts sorted by their labels, so the exposition is stable between scrapes."""
        with self._lock:
            return sorted(self._counts.items())


@dataclass
class Histogram:
    """A Prometheus histogram per label values: cumulative buckets, sum and count."""

    name: str
    help_text: str
    label_names: tuple[str, ...]
    bounds: tuple[float, ...]
    _cells: dict[tuple[str, ...], list] = field(default_factory=dict, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def observe(self, value: float, *labels: str) -> None:
        with self._lock:
            cell = self._cells.setdefault(labels, [[0] * (len(self.bounds) + 1), 0.0])
            cell[0][bisect.bisect_left(self.bounds, value)] += 1
            cell[1] += value

    def lines(self) -> list[str]:
        with self._lock:
            cells = sorted((labels, list(counts), total) for labels, (counts, total) in self._cells.items())
        out = _header(self.name, "histogram", self.help_text)
        for labels, counts, total in cells:
            running = 0
            for bound, count in zip((*self.bounds, float("inf")), counts):
                running += count
                le = 'le="+Inf"' if bound == float("inf") else f'le="{bound:g}"'
                out.append(f"{self.name}_bucket{_labels(self.label_names, labels, le)} {running}")
            # Every digit (TF Serving rounds to 6): a rounded sum moves in steps, and rate() with it.
            out.append(f"{self.name}_sum{_labels(self.label_names, labels)} {total!r}")
            out.append(f"{self.name}_count{_labels(self.label_names, labels)} {running}")
        return out


@dataclass
class ServingMetrics:
    """Everything serve-local exports; request and batch threads record concurrently."""

    requests: RequestCounter = field(default_factory=RequestCounter)
    request_latency: Histogram = field(
        default_factory=lambda: Histogram(
            f"{PREFIX}:request_latency",
            "Distribution of wall time (in microseconds) for Tensorflow Serving request.",
            ("model_name", "version", "API", "entrypoint"),
            LATENCY_BUCKETS,
        )
    )
    input_batch_size: Histogram = field(
        default_factory=lambda: Histogram(
            f"{PREFIX}:batching_session:input_batch_size", "Rows of each request a batch took in.", (), BATCH_BUCKETS
        )
    )
    processed_batch_size: Histogram = field(
        default_factory=lambda: Histogram(
            f"{PREFIX}:batching_session:processed_batch_size",
            "Rows of each batch run, padding included.",
            (),
            BATCH_BUCKETS,
        )
    )
    padding_size: Histogram = field(
        default_factory=lambda: Histogram(
            f"{PREFIX}:batching_session:padding_size",
            "Padding rows of each batch run, by the rows it ran.",
            ("execution_batch_size",),
            BATCH_BUCKETS,
        )
    )

    def record_batch(self, task_sizes: list[int], processed: int) -> None:
        """One batch run: each request's rows, the rows run, and the padding among them."""
        for size in task_sizes:
            self.input_batch_size.observe(size)
        self.processed_batch_size.observe(processed)
        self.padding_size.observe(processed - sum(task_sizes), str(processed))


def prometheus_text(metrics: ServingMetrics, manager: ModelManager, batching: bool = False) -> str:
    lines = _header(f"{PREFIX}:request_count", "counter", "The total number of requests.")
    for labels, count in metrics.requests.snapshot():
        lines.append(f"{PREFIX}:request_count{_labels(RequestCounter.LABELS, labels)} {count}")
    lines += metrics.request_latency.lines()
    if batching:
        lines += metrics.input_batch_size.lines() + metrics.processed_batch_size.lines()
        lines += metrics.padding_size.lines()
    versions = ":trainserve:serve_local:available_versions"
    lines += _header(versions, "gauge", "Versions of each configured model AVAILABLE now.")
    for name, model in sorted(manager.models.items()):
        lines.append(f"{versions}{_labels(('model_name',), (name,))} {len(model.available())}")
    return "\n".join(lines + version_state_lines(manager)) + "\n"


def version_state_lines(manager: ModelManager) -> list[str]:
    """One series per version the server knows, in its state: a failed load is END with error_code UNKNOWN
    (what GetModelStatus reports), so an alert can tell it from a version unloaded on purpose. Versions unloaded
    on purpose (END, OK) are left out: GetModelStatus keeps them all, but a series each would grow the page with
    every version ever published."""
    name = ":trainserve:serve_local:version_state"
    lines = _header(name, "gauge", "1 for each version of each configured model, labelled with its state.")
    for model_name, model in sorted(manager.models.items()):
        for version, state in sorted(list(model.versions.items())):
            if state.state == State.END and not state.error_message:
                continue
            values = (model_name, str(version), State.Name(state.state), state.error_code)
            lines.append(f"{name}{_labels(('model_name', 'version', 'state', 'error_code'), values)} 1")
    return lines
