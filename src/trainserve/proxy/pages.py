"""The proxy's own pages on its REST port (never forwarded): Prometheus counters, liveness and readiness, as
kubeflow/trainer separates them: `healthz` asks whether the proxy itself runs, `readyz` whether TF Serving answers
through it."""

from __future__ import annotations

from trainserve.exposition import CONTENT_TYPE, header, label_set
from trainserve.proxy.config import FORMER_PATHS
from trainserve.proxy.proxy_metrics import ProxyMetrics
from trainserve.proxy.upstream import SIDES, UpstreamLog
from trainserve.traffic.metrics import writer_lines
from trainserve.traffic.writer import TrafficWriter

UPSTREAM_FAILURES = ":trainserve:proxy:upstream_failures"
UPSTREAM_UP = ":trainserve:proxy:upstream_up"


def with_former_paths(pages: dict[str, object]) -> dict[str, object]:
    """`pages` also under the path each had before the rename, where it has its default path."""
    return pages | {FORMER_PATHS[path]: page for path, page in pages.items() if path in FORMER_PATHS}


def upstream_lines(upstream: UpstreamLog) -> list[str]:
    """What the proxy counts besides its writer's records: failures to reach TF Serving."""
    lines = header(
        UPSTREAM_FAILURES, "counter", "Calls (readiness checks included) that did not reach TF Serving, by side."
    )
    lines += [f"{UPSTREAM_FAILURES}{label_set(('side',), (side,))} {upstream.failures[side]}" for side in SIDES]
    lines += header(UPSTREAM_UP, "gauge", "1 when the last call of a side reached TF Serving.")
    lines += [f"{UPSTREAM_UP}{label_set(('side',), (side,))} {int(upstream.up(side))}" for side in SIDES]
    return lines


def metrics_page(prefix: str, writer: TrafficWriter, upstream: UpstreamLog, proxy: ProxyMetrics):
    def page() -> tuple[int, str, bytes]:
        lines = writer_lines({prefix: writer}) + upstream_lines(upstream) + proxy.lines()
        return 200, CONTENT_TYPE, ("\n".join(lines) + "\n").encode()

    return page


def live_page() -> tuple[int, str, bytes]:
    return 200, "text/plain", b"ok\n"


def ready_page(why_not_ready):
    """`why_not_ready()`: None when ready, else the reason, which the probe's answer carries."""

    def page() -> tuple[int, str, bytes]:
        reason = why_not_ready()
        return (200, "text/plain", b"ready\n") if reason is None else (503, "text/plain", f"{reason}\n".encode())

    return page
