"""The proxy's replicas as Prometheus sees them: its scrape targets (`up` of the proxy's job, one series per
replica), so that a rollout can tell a replica that is down or was not scraped from one that saw no traffic, and
wait until every replica has applied a routing change.

A look at a step's counts cannot be judged while a target is down (its calls since its last scrape are not in the
counts yet) or is up without the proxy's request counts (just started and not called yet, out of the Service, or
not the proxy at all: the wrong port under the proxy's job). A rollout whose Prometheus has had no target of the
job for an hour is refused: nothing scrapes the proxy, and holding would only wait for --max-hold.

One job is judged and waited for, so a rollout is refused, before it starts and at every look (a replica may appear
later), while a replica under another job routes the model (its routing gauge): that replica's calls to the
candidate would be neither counted nor waited for (a second proxy following the same routing file under another job
once ran a canary that rejected every call, and the candidate was promoted). Reading every job that exports the
gauge instead would count twice a replica that two jobs scrape (a static config beside a PodMonitor), and narrow
the checks' bounds on calls that were made once.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainserve.errors import TrainserveError
from trainserve.proxy.proxy_metrics import CANARY_PERCENT, REQUEST_COUNT
from trainserve.rollout.prometheus import Prometheus

PROXY_JOB = "proxy"  # the scrape job of the proxy in monitoring/prometheus*.yml and the k8s PodMonitor
REQUESTS = REQUEST_COUNT
LOOKBACK = "1h"  # a job without a target that long is not a replica being replaced: nothing scrapes the proxy


@dataclass(frozen=True)
class Targets:
    """The proxy's scrape targets by instance: True while its last scrape succeeded (`up == 1`); `silent`: those up
    whose page has no request counts."""

    up: dict[str, bool]
    job: str = PROXY_JOB
    silent: frozenset[str] = frozenset()

    @property
    def down(self) -> list[str]:
        return sorted(instance for instance, ok in self.up.items() if not ok)

    def unjudged(self) -> str | None:
        """Why counts taken now may be incomplete, in one line (None: every target counted)."""
        job = f"scrape job {self.job!r}"
        if not self.up:
            return f"no target of {job} in Prometheus now: the proxy's replicas are not scraped"
        said = [f"proxy targets down ({job}): {', '.join(self.down)}"] if self.down else []
        if self.silent:
            said.append(f"proxy targets up without request counts ({job}): {', '.join(sorted(self.silent))}")
        return "; ".join(said) or None


def proxy_targets(prometheus: Prometheus, job: str = PROXY_JOB) -> Targets:
    """`up` of every target of the proxy's scrape job (none: nothing scrapes the proxy now)."""
    found = prometheus.series(f'up{{job="{job}"}}')
    silent = prometheus.series(silent_query(job))
    return Targets(
        {labels.get("instance", ""): value == 1 for labels, value in found},
        job,
        frozenset(labels.get("instance", "") for labels, _ in silent),
    )


def silent_query(job: str) -> str:
    """The targets up whose last scrape had no request counts, in one evaluation (one scrape's samples)."""
    return f'up{{job="{job}"}} == 1 unless on (instance) count by (instance) ({REQUESTS}{{job="{job}"}})'


def refuse_unjudged_replicas(prometheus: Prometheus, job: str, model: str) -> None:
    """Before a rollout writes anything: refused when nothing scrapes the proxy as `job`, or when a replica under
    another job routes `model`."""
    if not proxy_targets(prometheus, job).up:
        refuse_if_never_scraped(prometheus, job)
    refuse_other_jobs(prometheus, job, model)


def refuse_other_jobs(prometheus: Prometheus, job: str, model: str) -> None:
    """A one-line refusal when a replica scraped under a job other than `job` reports a route of `model`."""
    found = prometheus.series(f'group by (job, instance) ({CANARY_PERCENT}{{job!="{job}",model_name="{model}"}})')
    if not found:
        return
    others = sorted({f"{labels.get('job', '')!r} ({labels.get('instance', '')})" for labels, _ in found})
    raise TrainserveError(
        f"model {model} is routed by proxy replicas under scrape job(s) {', '.join(others)}, not --proxy-job "
        f"{job!r}: their calls would be neither judged nor waited for; expected every replica that follows the "
        "routing file scraped under the one job --proxy-job names"
    )


def refuse_if_never_scraped(prometheus: Prometheus, job: str) -> None:
    """A one-line refusal when Prometheus has had no target of `job` for LOOKBACK: nothing scrapes the proxy."""
    if prometheus.series(f'present_over_time(up{{job="{job}"}}[{LOOKBACK}])'):
        return
    raise TrainserveError(
        f"Prometheus has no target of scrape job {job!r} (none in the last {LOOKBACK}): nothing scrapes the proxy, "
        "so no step could be judged; expected its metrics scraped as that job (monitoring/prometheus*.yml's "
        "`proxy` job; on Kubernetes the monitoring component's PodMonitor, k8s/components/monitoring), or "
        "--proxy-job naming the job that does"
    )
