"""Whether loading a version hurt `stable`'s callers (tensorflow/serving#1866: a load and its warmup share the
server's CPU and thread pools with every served version), judged from the proxy's series in Prometheus.

    before   stable's own p99, as histogram_quantile() places it over --stage-baseline before the load (the
             threshold, weighed in its bucket as trainserve.rollout.measure weighs a step's), and stable's calls
             over that window: how many were above it, how many failed (increase() over the window)
    during   stable's calls counted per proxy replica (trainserve.rollout.counting) from the last scrape before
             the config is written to the first scrape after the version is AVAILABLE: the load and its warmup,
             plus up to a scrape interval either side (a load shorter than the interval is diluted by them)
    judged   each share during minus the same share before, with anytime-valid bounds at --stage-alpha
             (trainserve.stats.sequential.difference_sequence, as the rollout's checks): shown above
             --stage-max-slow-increase (or --stage-max-error-increase), the version is unloaded and refused; fewer
             than --stage-min-calls calls during the load cannot be judged (said, recorded, staged) unless the
             damage is certain whatever the rest of them show

Stable's calls are every call the proxy counted under stable's version, whatever their route (a model staged
without --routing-file is not routed: its calls are `direct`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from trainserve.errors import TrainserveError
from trainserve.proxy.proxy_metrics import REQUEST_COUNT, REQUEST_LATENCY
from trainserve.rollout.config import StagingBudget
from trainserve.rollout.counting import tallied
from trainserve.rollout.follow import now
from trainserve.rollout.measure import ERRORS_EXCEPT, slow_calls, threshold, threshold_seconds
from trainserve.rollout.prometheus import Prometheus, PrometheusUnreachable
from trainserve.rollout.targets import proxy_targets
from trainserve.stats.sequential import difference_sequence

log = logging.getLogger(__name__)
SCRAPE_POLL_S = 0.5  # between two asks whether Prometheus has scraped the proxy since the load
DURING_SHARE = 0.8  # the load's share of alpha: its calls are the few; the window before has many


class StagingHurtStable(TrainserveError):
    """Loading the version hurt stable's callers beyond the budget (`record`: what the history keeps of it)."""

    def __init__(self, said: str, record: dict):
        super().__init__(said)
        self.record = record


def counters(job: str, model: str, stable: int, limit: dict | None) -> dict[str, str]:
    """Stable's counters by name, as selectors (with `limit`, the threshold's bucket bounds, the latency ones)."""
    version = f'job="{job}",model_name="{model}",version="{stable}"'
    found = {
        "calls": f"{REQUEST_COUNT}{{{version}}}",
        "errors": f'{REQUEST_COUNT}{{{version},status!~"{ERRORS_EXCEPT}"}}',
    }
    if limit is not None:
        timed = f'{REQUEST_LATENCY}_count{{{version},api="predict"}}'
        found["timed"] = timed
        for bound in ("le", "lower"):
            within = f'{REQUEST_LATENCY}_bucket{{{version},api="predict",le="{limit[bound]}"}}'
            found[f"above_{bound}"] = (timed, within)
    return found


def per_replica(selector: str | tuple[str, str], job: str) -> str:
    """What each replica counted now (0 for one scraped without the series)."""
    each = (lambda s: f"sum by (instance) ({s})") if isinstance(selector, str) else None
    expr = each(selector) if each else f"sum by (instance) ({selector[0]}) - sum by (instance) ({selector[1]})"
    return f'{expr} or sum by (instance) (up{{job="{job}"}} == 1) * 0'


def over_window(selector: str | tuple[str, str], window: str) -> str:
    """How much it grew over `window` before now, all replicas together."""
    if isinstance(selector, str):
        return f"sum(increase({selector}[{window}]))"
    return f"sum(increase({selector[0]}[{window}])) - sum(increase({selector[1]}[{window}]))"


def shares(counts: dict[str, float], limit: dict | None) -> dict[str, tuple[float, int]]:
    """(events, calls) of each judged share: failed calls; and, with a threshold, predict calls above it."""
    found = {"errors": (counts["errors"], int(counts["calls"]))}
    if limit is not None:
        slow = slow_calls(int(counts["above_le"]), int(counts["above_lower"]), limit["weight"])
        found["slow"] = (min(slow, counts["timed"]), int(counts["timed"]))
    return found


@dataclass(frozen=True)
class Finding:
    """One share during the load against before it: the bounds of the increase and whether they show damage."""

    name: str  # "slow" or "errors"
    during: tuple[float, int]
    before: tuple[float, int]
    low: float
    high: float
    budget: float
    hurt: bool
    judged: bool  # False: fewer calls than --stage-min-calls, and the damage not certain

    def fields(self) -> dict:
        return {
            "during": list(self.during),
            "before": list(self.before),
            "bounds": [round(self.low, 6), round(self.high, 6)],
            "budget": self.budget,
            "hurt": self.hurt,
            "judged": self.judged,
        }


def judge(name: str, during: tuple[float, int], before: tuple[float, int], budget: float, s: StagingBudget) -> Finding:
    """The increase of a share while loading: hurt when its anytime-valid lower bound is above `budget`; with fewer
    than --stage-min-calls calls, only when it would be whatever the rest of them show (calls without an event)."""
    events, n = during
    before = (min(before[0], before[1]), before[1])
    low, high = difference_sequence((min(events, n), n), before, s.alpha, DURING_SHARE)
    if n >= s.min_calls:
        return Finding(name, during, before, low, high, budget, low > budget, True)
    padded = difference_sequence((min(events, n), s.min_calls), before, s.alpha, DURING_SHARE)[0]
    return Finding(name, during, before, low, high, budget, padded > budget, padded > budget)


def _pct(events: float, n: int) -> str:
    return f"{100 * events / n:.0f} %" if n else "none"


def damage_line(finding: Finding, version: int, p99: float | None, seconds: float) -> str:
    """The one line of a refusal: `staging version 3 slowed stable: 41 % of its calls above its p99 ...`."""
    if finding.name == "slow":
        what = f"slowed stable: {_pct(*finding.during)} of its calls above its p99 of {1000 * (p99 or 0):.1f} ms"
    else:
        what = f"made stable fail: {_pct(*finding.during)} of its calls failed"
    return (
        f"staging version {version} {what} (before: {_pct(*finding.before)}; budget +{100 * finding.budget:g} "
        f"points; the increase's anytime bounds [{100 * finding.low:+.1f}, {100 * finding.high:+.1f}] points, "
        f"{finding.during[1]} calls) while it loaded in {seconds:.0f} s; unloaded"
    )


class StagingWatch:
    """Stable's calls through the proxy while `version` of `model` loads beside `stable`. `begin()` before the
    config is written, `end()` once the version is AVAILABLE; `clock` and `sleep` are time's, or a test's."""

    def __init__(
        self,
        prometheus: Prometheus,
        model: str,
        version: int,
        stable: int,
        budget: StagingBudget,
        job: str,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.prometheus, self.model, self.version, self.stable = prometheus, model, version, stable
        self.budget, self.job, self.clock, self.sleep = budget, job, clock, sleep
        self.limit: dict | None = None
        self.before: dict[str, float] = {}
        self.seen: dict[str, dict[str, int]] = {}
        self.started = 0.0

    def _counters(self) -> dict:
        return counters(self.job, self.model, self.stable, self.limit)

    def begin(self) -> None:
        """Stable's p99 and its calls over the window before, and each replica's counters now."""
        window = f"{self.budget.baseline:g}s"
        version = f'job="{self.job}",model_name="{self.model}",version="{self.stable}",api="predict"'
        buckets = f"sum by (le) (rate({REQUEST_LATENCY}_bucket{{{version}}}[{window}]))"
        self.limit = threshold([(s.get("le", ""), v) for s, v in self.prometheus.series(buckets)])
        self.before = {
            name: self.prometheus.value(over_window(sel, window)) or 0.0 for name, sel in self._counters().items()
        }
        self.seen = {name: {} for name in self._counters()}
        self._tally()
        self.started = self.clock()

    def _tally(self) -> dict[str, float]:
        counted = {}
        for name, selector in self._counters().items():
            answer = {s.get("instance", ""): v for s, v in self.prometheus.series(per_replica(selector, self.job))}
            self.seen[name], counted[name] = tallied(self.seen[name], 0, answer)
        return counted

    def end(self, wait: float) -> dict:
        """The load judged: the history's `staging` record; raises StagingHurtStable (the version still loaded:
        the caller unloads it) when a share is shown above its budget."""
        seconds = self.clock() - self.started
        unscraped = self._await_scrape(wait)
        during = self._tally()
        p99 = threshold_seconds(self.limit) if self.limit else None
        before, now_ = shares(self.before, self.limit), shares(during, self.limit)
        budgets = {"slow": self.budget.max_slow_increase, "errors": self.budget.max_error_increase}
        found = [judge(name, now_[name], before[name], budgets[name], self.budget) for name in now_]
        record = {
            "version": self.version,
            "load_seconds": round(seconds, 3),
            "stable_p99_seconds": p99,
            "unscraped": unscraped,
            **{f.name: f.fields() for f in found},
        }
        hurt = next((f for f in found if f.hurt), None)
        record["judged"] = hurt is not None or (all(f.judged for f in found) and self.limit is not None)
        if hurt is not None:
            record["refused"] = damage_line(hurt, self.version, p99, seconds)
            raise StagingHurtStable(record["refused"], {"watched": True, **record})
        record["said"] = self._said(found, seconds)
        log.log(logging.INFO if record["judged"] else logging.WARNING, "model %s: %s", self.model, record["said"])
        return record

    def _said(self, found: list[Finding], seconds: float) -> str:
        """The verdict of a load that did not hurt stable, in one line."""
        head = f"staging version {self.version}: loaded in {seconds:.0f} s"
        if self.limit is None:
            return f"{head}; stable had no predict calls over --stage-baseline before it: its latency not judged"
        calls = found[0].during[1]
        if not all(f.judged for f in found):
            return (
                f"{head}; {calls} calls of stable while it loaded, fewer than --stage-min-calls "
                f"{self.budget.min_calls}: the load cannot be judged (staged)"
            )
        words = {"slow": "above its p99", "errors": "failed"}
        shown = ", ".join(f"{words[f.name]} {_pct(*f.during)} (before {_pct(*f.before)})" for f in reversed(found))
        return f"{head}; stable's {calls} calls meanwhile not shown hurt beyond the budget: {shown}"

    def _await_scrape(self, wait: float) -> str | None:
        """Until every proxy replica up has been scraped since now (its counts include the whole load), within
        `wait` seconds; else which were not, judged on the counts there are."""
        since, deadline = now(self.prometheus), self.clock() + wait
        while True:
            targets = proxy_targets(self.prometheus, self.job)
            scraped = {
                s.get("instance", ""): t for s, t in self.prometheus.series(f'timestamp(up{{job="{self.job}"}})')
            }
            late = sorted(i for i, up in targets.up.items() if up and scraped.get(i, 0.0) <= since)
            if not late or self.clock() >= deadline:
                return ", ".join(late) or None
            self.sleep(SCRAPE_POLL_S)


def watcher(
    prometheus: Prometheus | None, job: str, model: str, version: int, stable: int | None, budget: StagingBudget
) -> tuple[StagingWatch | None, str | None]:
    """A begun StagingWatch of the load of `version`, or None and why (said in one log line) where nothing can
    watch: no --prometheus, no stable yet, no proxy replica scraped, Prometheus unreachable."""
    why = None
    if prometheus is None:
        why = "no --prometheus"
    elif stable is None:
        why = "no stable version to hurt"
    if why is None:
        try:
            watch = StagingWatch(prometheus, model, version, stable, budget, job)
            if not proxy_targets(prometheus, job).up:
                why = f"no proxy replica scraped as job {job!r} in Prometheus (the model is not called through a proxy)"
            else:
                watch.begin()
                return watch, None
        except PrometheusUnreachable as exc:
            why = str(exc)
    log.warning("model %s: stable's calls not watched while version %d loads: %s", model, version, why)
    return None, why


def judged(watch: StagingWatch | None, why: str | None, wait: float) -> dict:
    """The history's `staging` record of a load that did not hurt stable (or could not be watched: why not);
    raises StagingHurtStable when it did."""
    if watch is None:
        return {"watched": False, "why": why}
    try:
        return {"watched": True, **watch.end(wait)}
    except PrometheusUnreachable as exc:
        log.warning("model %s: the load of version %d not judged: %s", watch.model, watch.version, exc)
        return {"watched": False, "why": str(exc)}
