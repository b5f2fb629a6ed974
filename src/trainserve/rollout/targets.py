"""The capture proxy's replicas as Prometheus sees them: its scrape targets (`up` of the proxy's job, one series per
replica), so that a rollout can tell a replica that is down or was not scraped from one that saw no traffic, and
wait until every replica has applied a routing change."""

from __future__ import annotations

from dataclasses import dataclass

from trainserve.rollout.prometheus import Prometheus

PROXY_JOB = "capture"  # the scrape job of the proxy in monitoring/prometheus*.yml and the k8s PodMonitor


@dataclass(frozen=True)
class Targets:
    """The proxy's scrape targets by instance: True while its last scrape succeeded (`up == 1`)."""

    up: dict[str, bool]

    @property
    def down(self) -> list[str]:
        return sorted(instance for instance, ok in self.up.items() if not ok)


def proxy_targets(prometheus: Prometheus, job: str = PROXY_JOB) -> Targets:
    """`up` of every target of the proxy's scrape job (none: nothing scrapes the proxy)."""
    found = prometheus.series(f'up{{job="{job}"}}')
    return Targets({labels.get("instance", ""): value == 1 for labels, value in found})
