"""Prometheus metrics in the text exposition format, served on the REST port when
`--monitoring_config_file` enables them (config/monitoring_config.proto).

The request counter keeps TF Serving's metric name (`:tensorflow:serving:request_count`, from
servables/tensorflow/util.cc) so dashboards built on the real server read serve-local too.
"""

from __future__ import annotations

import threading
from collections import Counter

from trainserve.serving.manager import ModelManager

CONTENT_TYPE = "text/plain; version=0.0.4"


class RequestCounter:
    """Finished requests by (model name, API, gRPC status name); request threads add concurrently."""

    def __init__(self) -> None:
        self._counts: Counter[tuple[str, str, str]] = Counter()
        self._lock = threading.Lock()

    def add(self, model_name: str, api: str, status: str) -> None:
        with self._lock:
            self._counts[(model_name, api, status)] += 1

    def snapshot(self) -> list[tuple[tuple[str, str, str], int]]:
        """The counts sorted by their labels, so the exposition is stable between scrapes."""
        with self._lock:
            return sorted(self._counts.items())


def prometheus_text(requests: RequestCounter, manager: ModelManager) -> str:
    lines = ["# TYPE :tensorflow:serving:request_count counter"]
    for (name, api, status), count in requests.snapshot():
        lines.append(f':tensorflow:serving:request_count{{model_name="{name}",api="{api}",status="{status}"}} {count}')
    lines.append("# TYPE :trainserve:serve_local:available_versions gauge")
    for name, model in sorted(manager.models.items()):
        lines.append(f':trainserve:serve_local:available_versions{{model_name="{name}"}} {len(model.available())}')
    return "\n".join(lines) + "\n"
