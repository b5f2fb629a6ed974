"""The traffic a plan is sized for, from the proxy's series in Prometheus (or --expected-rate).

The rate is the model's calls through the proxy, every version and route (before a rollout they all go to stable):
the slowest hour among the hours of the day a plan of --max-duration would span, over the last --rate-history
(Prometheus's `hour()` is UTC), so that a rollout started at 5 pm is sized for its quietest night hour, not for
the afternoon; an hour counts only where Prometheus saw the model's calls for all of it. Where Prometheus keeps no
such hour (a new model, a short retention), the last hour's rate, over as much of the hour as it saw.
Stable's error share (every status but OK and CANCELLED, as the checks count them) is the last hour's.

Both are read to two significant figures: an estimate of the traffic to come is no finer, and the sizing (seeded
by the rate) then gives a dry run and the start a minute later the same plan while the traffic is steady.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainserve.errors import TrainserveError
from trainserve.rollout.measure import ERRORS_EXCEPT
from trainserve.rollout.prometheus import Prometheus
from trainserve.rollout.targets import REQUESTS

HOUR = 3600.0


@dataclass(frozen=True)
class Traffic:
    """What a plan is sized for: requests per second, stable's error share, and where they come from."""

    rate: float
    error_share: float = 0.0
    source: str = "--expected-rate"

    def describe(self) -> str:
        return f"{self.rate:.3g} requests/s ({self.source}), stable's error share {self.error_share:.2%}"


def _calls(model: str, job: str) -> str:
    return f'{REQUESTS}{{job="{job}",model_name="{model}"}}'


def rate_query(model: str, job: str) -> str:
    """The model's calls per second through the proxy over the hour before each evaluation."""
    return f"sum(rate({_calls(model, job)}[1h]))"


def seen_query(model: str, job: str) -> str:
    """Seconds of the last hour since Prometheus first saw a call of the model (its oldest sample in the hour, to the
    second), at most the hour."""
    first = f"min(min_over_time(timestamp({_calls(model, job)})[1h:1s]))"
    return f"clamp_max(time() - {first}, {HOUR:g})"


def last_hour_query(model: str, job: str) -> str:
    """The model's calls per second over the last hour, or over the part of it Prometheus saw: rate() divides by the
    whole hour, so a series minutes old would read as a small fraction of its rate."""
    return f"{rate_query(model, job)} * {HOUR:g} / {seen_query(model, job)}"


def errors_query(model: str, job: str) -> str:
    selector = f'job="{job}",model_name="{model}",status!~"{ERRORS_EXCEPT}"'
    return f"sum(rate({REQUESTS}{{{selector}}}[1h])) / {rate_query(model, job)}"


def hours_of(now: float, span: float) -> str | None:
    """A PromQL filter true in the UTC hours of the day from `now` (epoch seconds) over `span` seconds (None: every
    hour: the span covers a day)."""
    if span + HOUR >= 24 * HOUR:
        return None
    first = int(now // HOUR) % 24
    last = (first + math.ceil(span / HOUR)) % 24  # the hour the span ends in, included
    if first <= last:
        return f"(hour() >= {first} and hour() <= {last})"
    return f"(hour() >= {first} or hour() <= {last})"


def slowest_hour_query(model: str, job: str, history: str, now: float, span: float) -> str:
    """The least hourly rate of the model at the hours of the day the plan spans, over `history` (`7d`): of the
    hours whose start Prometheus saw calls at (a younger series' rate() would divide its minutes by the hour)."""
    hours = hours_of(now, span)
    whole = f"({rate_query(model, job)} and on () count({_calls(model, job)} offset 1h))"
    rate = whole if hours is None else f"({whole} and on () {hours})"
    return f"min_over_time({rate}[{history}:5m])"


def read_traffic(prometheus: Prometheus, model: str, job: str, history: str, now: float, span: float) -> Traffic:
    """The rate to size for (see the module's docstring); refused in one line when Prometheus saw no call."""
    slowest = prometheus.value(slowest_hour_query(model, job, history, now, span)) if history else None
    if slowest == 0:
        raise TrainserveError(
            f"model {model} had an hour without calls at these hours of the day (UTC) over the last {history}: a "
            "plan sized for it could not decide; expected --expected-rate REQUESTS_PER_S (the rate to size for), "
            "--rate-history '' (the last hour's rate), or an explicit --plan"
        )
    rate, source = slowest, f"the slowest hour at these hours of the day over the last {history}"
    if slowest is None:
        rate, source = prometheus.value(last_hour_query(model, job)), "the last hour"
    if not rate:
        raise TrainserveError(
            f"Prometheus shows no call of model {model} through the proxy (scrape job {job!r}) in the last hour: a "
            "plan cannot be sized on no traffic; expected --expected-rate REQUESTS_PER_S, or an explicit --plan"
        )
    errors = prometheus.value(errors_query(model, job)) or 0.0
    return Traffic(_figures(rate), _figures(min(max(errors, 0.0), 1.0)), source)


def _figures(value: float) -> float:
    """`value` to two significant figures (see the module's docstring)."""
    return float(f"{value:.2g}")
