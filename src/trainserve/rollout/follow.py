"""Whether every replica of the proxy follows a routing change, from what it exports: each replica polls the
routing file on its own (--routing-poll-seconds), so a change is in force only once all of them report it.

A replica reports the routing it runs as gauges (`:trainserve:proxy:canary_percent{model_name,version}`,
trainserve.proxy.proxy_metrics). It follows a change when its scrape target is up, Prometheus scraped it after the
change was written (Prometheus's own clock: `timestamp(up)` against `time()` asked after the write), and its gauge
for the model says what the change says. No target at all is never "followed": nothing confirms anything then.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from trainserve.proxy.proxy_metrics import CANARY_PERCENT
from trainserve.rollout.prometheus import Prometheus, PrometheusUnreachable
from trainserve.rollout.targets import proxy_targets

log = logging.getLogger(__name__)
FOLLOW_POLL_S = 1.0  # between two asks whether the replicas follow

# A replica's canary gauges for the model, (version, percent) each, judged: whether it runs the change.
Judge = Callable[[list[tuple[str, float]]], bool]


def no_canary(gauges: list[tuple[str, float]]) -> bool:
    """The replica sends no request of the model to a candidate: no route, or a route with no canary share."""
    return all(percent == 0 for _, percent in gauges)


def routed_to(candidate: int) -> Judge:
    """The replica routes the model with `candidate` named (whatever its shares)."""
    return lambda gauges: any(version == str(candidate) for version, _ in gauges)


def now(prometheus: Prometheus) -> float:
    """Prometheus's clock now (a replica scraped after this was scraped after whatever came before)."""
    return prometheus.value("vector(time())") or 0.0  # an instant query answers vectors only (prometheus.py)


def not_following(prometheus: Prometheus, job: str, model: str, since: float, judge: Judge) -> str | None:
    """None when every replica of scrape job `job` follows the change written before `since`; else which do not,
    and why, in one line. Raises PrometheusUnreachable when Prometheus cannot answer."""
    targets = proxy_targets(prometheus, job)
    if not targets.up:
        return f"Prometheus has no target of scrape job {job!r} (the proxy): no replica can confirm it"
    if targets.down:
        return f"proxy replica(s) {', '.join(targets.down)} down (up == 0)"
    scraped = {labels.get("instance", ""): t for labels, t in prometheus.series(f'timestamp(up{{job="{job}"}})')}
    unscraped = sorted(i for i in targets.up if scraped.get(i, 0.0) <= since)
    if unscraped:
        return f"proxy replica(s) {', '.join(unscraped)} not scraped since the change"
    gauges: dict[str, list[tuple[str, float]]] = {}
    for labels, percent in prometheus.series(f'{CANARY_PERCENT}{{job="{job}",model_name="{model}"}}'):
        gauges.setdefault(labels.get("instance", ""), []).append((labels.get("version", ""), percent))
    lagging = sorted(i for i in targets.up if not judge(gauges.get(i, [])))
    if lagging:
        return f"proxy replica(s) {', '.join(lagging)} still report the routing before the change"
    return None


def await_followers(
    prometheus: Prometheus | None,
    job: str,
    model: str,
    judge: Judge,
    wait: float,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    poll_s: float = FOLLOW_POLL_S,
) -> str | None:
    """Wait, within `wait` seconds, until every replica of `job` reports the routing just written (None), else why
    not (one line); Prometheus unreachable counts as not confirmed, asked again until the wait is over."""
    if prometheus is None:
        return "no --prometheus to ask"
    deadline, since = clock() + wait, None
    while True:
        try:
            since = now(prometheus) if since is None else since
            why = not_following(prometheus, job, model, since, judge)
        except PrometheusUnreachable as exc:
            why = str(exc)
        if why is None:
            return None
        if clock() >= deadline:
            return why
        log.info("model %s: waiting for the proxy's replicas: %s", model, why)
        sleep(poll_s)
