"""A small client of Prometheus's HTTP API (`/api/v1/query`, an instant query), with the standard library: what
the rollout controller asks between steps. One value per query: the queries aggregate to one series.

An answer that cannot be had (Prometheus down, a timeout, an error status, a reply that is not the API's) is a
`PrometheusUnreachable` naming the URL and why: the controller holds on it, it never advances on no answer.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request

from trainserve.errors import TrainserveError


class PrometheusUnreachable(TrainserveError):
    """No answer from Prometheus: the rollout holds."""


class Prometheus:
    """`url` is Prometheus's base URL (http://prometheus:9090); `timeout` bounds each query."""

    def __init__(self, url: str, timeout: float = 10.0):
        self.url = url.rstrip("/")
        self.timeout = timeout

    def value(self, expr: str) -> float | None:
        """The one value `expr` has now; None when it returns no series or NaN (no data: nothing is known)."""
        result = self._query(expr)
        if not result:
            return None
        if len(result) > 1:
            raise PrometheusUnreachable(
                f"Prometheus at {self.url}: {expr!r} returned {len(result)} series: expected one (an aggregation)"
            )
        value = float(result[0]["value"][1])
        return None if math.isnan(value) else value

    def series(self, expr: str) -> list[tuple[dict[str, str], float]]:
        """Every series `expr` returns now, as (labels, value); NaN values left out."""
        found = [(r["metric"], float(r["value"][1])) for r in self._query(expr)]
        return [(labels, value) for labels, value in found if not math.isnan(value)]

    def _query(self, expr: str) -> list[dict]:
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as response:  # noqa: S310 (an http(s) URL)
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            said = _error_of(exc)
            raise PrometheusUnreachable(f"Prometheus at {self.url} refused {expr!r}: HTTP {exc.code} {said}") from None
        except (OSError, ValueError) as exc:  # refused, timed out, DNS, not JSON
            reason = getattr(exc, "reason", None) or exc
            raise PrometheusUnreachable(f"Prometheus at {self.url} cannot be reached: {reason}") from None
        data = body.get("data") if isinstance(body, dict) else None
        if body.get("status") != "success" or not isinstance(data, dict) or data.get("resultType") != "vector":
            raise PrometheusUnreachable(f"Prometheus at {self.url}: {expr!r} did not return a vector: {body!r:.200}")
        return data["result"]


def _error_of(exc: urllib.error.HTTPError) -> str:
    try:
        return json.loads(exc.read()).get("error", "")
    except (OSError, ValueError, AttributeError):
        return ""


def check_url(url: str) -> None:
    """An http(s) URL with a host, judged before anything is touched."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise TrainserveError(f"--prometheus {url!r}: expected an http(s) URL such as http://prometheus:9090")
