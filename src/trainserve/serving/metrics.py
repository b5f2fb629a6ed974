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

The page is written by trainserve.exposition. TF Serving labels request_count with whatever name a request asked
for; here a name no configured model has is counted as UNKNOWN_MODEL, so clients cannot grow the page without
bound.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

from trainserve.exposition import LATENCY_BUCKETS, Histogram, header, label_set
from trainserve.serving.manager import ModelManager, State

PREFIX = ":tensorflow:serving"
BATCH_BUCKETS = tuple(2.0**i for i in range(15))  # 1 .. 16384 rows


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
    lines = header(f"{PREFIX}:request_count", "counter", "The total number of requests.")
    for labels, count in metrics.requests.snapshot():
        lines.append(f"{PREFIX}:request_count{label_set(RequestCounter.LABELS, labels)} {count}")
    lines += metrics.request_latency.lines()
    if batching:
        lines += metrics.input_batch_size.lines() + metrics.processed_batch_size.lines()
        lines += metrics.padding_size.lines()
    versions = ":trainserve:serve_local:available_versions"
    lines += header(versions, "gauge", "Versions of each configured model AVAILABLE now.")
    for name, model in sorted(manager.models.items()):
        lines.append(f"{versions}{label_set(('model_name',), (name,))} {len(model.available())}")
    return "\n".join(lines + version_state_lines(manager)) + "\n"


def version_state_lines(manager: ModelManager) -> list[str]:
    """One series per version the server knows, in its state: a failed load is END with error_code UNKNOWN
    (what GetModelStatus reports), so an alert can tell it from a version unloaded on purpose. Versions unloaded
    on purpose (END, OK) are left out: GetModelStatus keeps them all, but a series each would grow the page with
    every version ever published."""
    name = ":trainserve:serve_local:version_state"
    lines = header(name, "gauge", "1 for each version of each configured model, labelled with its state.")
    for model_name, model in sorted(manager.models.items()):
        for version, state in sorted(list(model.versions.items())):
            if state.state == State.END and not state.error_message:
                continue
            values = (model_name, str(version), State.Name(state.state), state.error_code)
            lines.append(f"{name}{label_set(('model_name', 'version', 'state', 'error_code'), values)} 1")
    return lines
