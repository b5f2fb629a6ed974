"""A canary step's counts through a real Prometheus scraping two proxy replicas (stand-ins whose counters the test
sets), as the repository's scrape config names them: one replica misses scrapes mid-step (its page answers 500)
while it goes on counting, then restarts. The step's counts never exceed what the replicas counted during the
step, every look while a replica is down or up without counts is unjudged and says which, and once it is back the
counts are exactly the step's: a candidate failing 10 % of its canary calls is counted at 10 %, not at the 0.8 %
that re-basing on the fallen sum gave when the replica's history re-entered. A Prometheus that has never scraped
the proxy's job refuses the rollout."""

from __future__ import annotations

import math
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from prometheus_server import Prometheus
from trainserve.errors import TrainserveError
from trainserve.rollout.measure import Meter
from trainserve.rollout.prometheus import Prometheus as Client

pytestmark = pytest.mark.integration  # a Prometheus process, sockets

BOUNDS = tuple(10 * 1.8**i for i in range(33))
FAST, SLOW = 1000.0, 20000.0  # microseconds: under and over stable's p99 bucket
P99_WEIGHT = 0.01  # stable's calls before the step all FAST: 1 % of its bucket lies above its p99
STABLE, CANDIDATE = 1, 2


class Replica:
    """One proxy replica's page: request counts by (version, status, route), latency by (version, micros)."""

    def __init__(self):
        self.requests: Counter = Counter()
        self.latency: Counter = Counter()
        self.failing = False
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = outer.page().encode() if self.path == "/monitoring/proxy/metrics" else b""
                self.send_response(500 if outer.failing and body else 200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.target = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def calls(self, version: int, route: str, statuses: dict[str, int], micros: dict[float, int]) -> None:
        with self.lock:
            for status, n in statuses.items():
                self.requests[(version, status, route)] += n
            for value, n in micros.items():
                self.latency[(version, value)] += n

    def restart(self) -> None:
        with self.lock:
            self.requests.clear()
            self.latency.clear()

    def page(self) -> str:
        with self.lock:
            requests, latency = sorted(self.requests.items()), dict(self.latency)
        lines = []
        for (version, status, route), n in requests:
            labels = f'model_name="m",version="{version}",api="predict",status="{status}",route="{route}"'
            lines.append(f":trainserve:proxy:request_count{{{labels}}} {n}")
        for version in sorted({v for v, _ in latency}):
            mine = {micros: n for (v, micros), n in latency.items() if v == version}
            labels = f'model_name="m",version="{version}",api="predict"'
            for bound in (*BOUNDS, math.inf):
                le = "+Inf" if bound == math.inf else f"{bound:g}"
                below = sum(n for micros, n in mine.items() if micros <= bound)
                lines.append(f':trainserve:proxy:request_latency_bucket{{{labels},le="{le}"}} {below}')
            lines.append(f":trainserve:proxy:request_latency_count{{{labels}}} {sum(mine.values())}")
        return "\n".join(lines) + "\n"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Step:
    """What the replicas counted since the step began, by Look.counts' keys: the truth the counts are held to."""

    def __init__(self):
        self.true: Counter = Counter()

    def traffic(self, replica: Replica, scale: int = 10) -> None:
        """`scale` x 100 canary calls, 10 % failing (INTERNAL, and rejections: the candidate's doing), 10 % slow;
        and stable's share of the same callers, 1 % UNAVAILABLE, callers giving up on some (CANCELLED)."""
        canary = {"OK": 90 * scale, "INTERNAL": 5 * scale, "INVALID_ARGUMENT": 5 * scale}
        stable = {"OK": 990 * scale, "UNAVAILABLE": 10 * scale, "CANCELLED": 5 * scale}
        replica.calls(CANDIDATE, "canary", canary, {FAST: 90 * scale, SLOW: 10 * scale})
        replica.calls(STABLE, "stable", stable, {FAST: 995 * scale, SLOW: 10 * scale})
        self.true.update(
            canary_requests=100 * scale,
            canary_errors=10 * scale,
            candidate_latency_count=100 * scale,
            candidate_slow=10 * scale + P99_WEIGHT * 90 * scale,  # the calls in stable's p99 bucket weighed
            stable_requests=1005 * scale,
            stable_errors=10 * scale,
            stable_latency_count=1005 * scale,
            stable_slow=10 * scale + P99_WEIGHT * 995 * scale,
        )


def scraped(prometheus: Prometheus, replica: Replica, up: int = 1) -> bool:
    """Prometheus' last scrape of `replica` has `up`, and (up) the page's calls as they are now."""
    instance = f'job="proxy",instance="{replica.target}"'
    if [s["value"][1] for s in prometheus.query(f"up{{{instance}}}")] != [str(up)]:
        return False
    found = prometheus.query(f"sum(:trainserve:proxy:request_count{{{instance}}})")
    total = sum(replica.requests.values())
    return up == 0 or [float(s["value"][1]) for s in found] == ([float(total)] if total else [])


def test_a_replica_missing_scrapes_neither_inflates_nor_rebases_a_canary_step(tmp_path):
    a, b = Replica(), Replica()
    prometheus = None
    try:
        # Before the step: b answered 20000 canary calls of an earlier step, all OK; stable's p99 is in FAST's bucket.
        b.calls(CANDIDATE, "canary", {"OK": 20000}, {FAST: 20000})
        a.calls(CANDIDATE, "canary", {"OK": 5000}, {FAST: 5000})
        for replica in (a, b):
            replica.calls(STABLE, "stable", {"OK": 1000}, {FAST: 1000})
        prometheus = Prometheus(tmp_path, a.target, proxy=[a.target, b.target], interval="250ms")
        wait = prometheus.wait_for
        wait(lambda: scraped(prometheus, a) and scraped(prometheus, b), "both replicas scraped")
        for replica in (a, b):  # a second sample with more calls: stable has a rate, so a p99
            replica.calls(STABLE, "stable", {"OK": 1000}, {FAST: 1000})
        wait(lambda: scraped(prometheus, a) and scraped(prometheus, b), "stable's rate")

        meter, step = Meter(Client(prometheus.url), "m", CANDIDATE, STABLE), Step()
        state = meter.origin()
        assert state["le"] == f"{next(b for b in BOUNDS if b >= FAST):g}"  # FAST's bucket: stable's p99 there
        looks = []

        def look(what: str):
            found = meter.look(looks[-1].state if looks else state)
            looks.append(found)
            assert all(found.counts[k] <= step.true[k] + 1e-9 for k in step.true), (what, found.counts, dict(step.true))
            return found

        for replica in (a, b):
            step.traffic(replica)
        wait(lambda: scraped(prometheus, a) and scraped(prometheus, b), "the step's first calls")
        first = look("both replicas scraped")
        assert first.unjudged is None and {k: first.counts[k] for k in step.true} == pytest.approx(step.true)

        b.failing = True
        wait(lambda: scraped(prometheus, b, up=0), "b's failed scrape")
        for replica in (a, b):  # b goes on answering calls while nobody scrapes it
            step.traffic(replica)
        wait(lambda: scraped(prometheus, a) and scraped(prometheus, b, up=0), "a's calls, b still down")
        down = look("b down")
        assert down.unjudged == f"proxy targets down (scrape job 'proxy'): {b.target}"
        assert down.counts["canary_requests"] == first.counts["canary_requests"] + 1000  # a's, and nothing re-based

        b.failing = False
        wait(lambda: scraped(prometheus, b), "b scraped again")
        back = look("b back")
        assert back.unjudged is None and {k: back.counts[k] for k in step.true} == pytest.approx(step.true)  # b's, once
        assert back.counts["canary_errors"] / back.counts["canary_requests"] == 0.1

        b.restart()  # a new process: no calls yet, then counting from 0
        wait(lambda: scraped(prometheus, b), "b restarted, its page without calls")
        fresh = look("b restarted")
        assert fresh.unjudged == f"proxy targets up without request counts (scrape job 'proxy'): {b.target}"
        step.traffic(b, scale=1)
        wait(lambda: scraped(prometheus, b), "b's first calls since its restart")
        last = look("b counting again")
        assert last.unjudged is None and {k: last.counts[k] for k in step.true} == pytest.approx(step.true)

        with pytest.raises(TrainserveError, match="no target of scrape job 'nothing-scrapes-this'.*PodMonitor"):
            Meter(Client(prometheus.url), "m", CANDIDATE, STABLE, job="nothing-scrapes-this").origin()
    finally:
        if prometheus is not None:
            prometheus.stop()
        a.stop()
        b.stop()
