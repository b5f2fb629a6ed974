"""`trainserve rollout` against a real Prometheus, which evaluates the repository's recording rules on series that a
stand-in proxy exports: a traffic model driven by the routing file the controller writes (each scrape is
one tick of requests addressed to `stable`, split as the routing says), with the flip share and the flow each test
sets. So the rollback, hold, pause and resume decisions are made on counts the test controls, through the real
queries and rules. (End to end on serve-local and the real proxy: test_rollout_controller_live.py.)"""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from reports import compared_with, eval_report, write

from conftest import REPO
from prometheus_server import Prometheus
from trainserve.cli import main
from trainserve.proxy.routing import read_routing
from trainserve.rollout.config import CandidateConfig, PromoteConfig
from trainserve.rollout.config_file import history_path, read_config
from trainserve.rollout.history import read_history
from trainserve.rollout.labels import Rollout
from trainserve.rollout.steps import promote, stage_candidate

pytestmark = pytest.mark.integration  # a Prometheus process, sockets

LATENCY_BUCKETS = tuple(10 * 1.8**i for i in range(33))  # serve-local's (and the proxy's) microsecond buckets
SHORT = "shadow 1s, 5% 1s, 100%"


class Traffic:
    """One model's clients: `per_tick` requests to `stable` per scrape, routed as the routing file says now."""

    def __init__(self, routing: Path, stable: int, candidate: int, **behaviour):
        self.routing, self.stable, self.candidate = routing, stable, candidate
        self.per_tick = 4000  # at 5 %: 200 canary calls a scrape, the ~2,600 a 1-point budget needs in 13
        self.flip_share = 0.0  # of the shadow pairs
        self.flowing = True
        self.__dict__.update(behaviour)
        self.requests: dict[tuple, float] = {}  # (version, status, route) -> count
        self.latency: dict[int, list[float]] = {}  # version -> micros observed, one value per tick (x count)
        self.shadow = {"compared": 0.0, "error": 0.0, "dropped_queue_full": 0.0, "pairs": 0.0, "flips": 0.0}

    def tick(self) -> None:
        if not self.flowing:
            return
        route = read_routing(self.routing).route(self.model)
        shadow, canary = (route.shadow_percent, route.canary_percent) if route else (0.0, 0.0)
        n = self.per_tick
        to_candidate = n * canary / 100
        self._answer(self.stable, "stable", n - to_candidate)
        self._answer(self.candidate, "canary", to_candidate)
        copies = (n - to_candidate) * shadow / 100
        self.shadow["compared"] += copies
        self.shadow["pairs"] += 8 * copies  # 8 examples a request
        self.shadow["flips"] += 8 * copies * self.flip_share

    def _answer(self, version: int, route: str, count: float) -> None:
        """`count` calls answered OK by `version`, each in 1 ms."""
        if count > 0:
            key = (version, "OK", route)
            self.requests[key] = self.requests.get(key, 0.0) + count
            self.latency.setdefault(version, []).append(1000.0)
            self.latency[version].append(count)

    def lines(self) -> list[str]:
        m, out = self.model, []
        for (version, status, route), count in sorted(self.requests.items()):
            labels = f'model_name="{m}",version="{version}",api="predict",status="{status}",route="{route}"'
            out.append(f":trainserve:proxy:request_count{{{labels}}} {math.floor(count)}")
        for version, pairs in sorted(self.latency.items()):
            observed = list(zip(pairs[::2], pairs[1::2]))
            for bound in (*LATENCY_BUCKETS, math.inf):
                below = sum(math.floor(c) for micros, c in observed if micros <= bound)
                le = "+Inf" if bound == math.inf else f"{bound:g}"
                labels = f'model_name="{m}",version="{version}",api="predict",le="{le}"'
                out.append(f":trainserve:proxy:request_latency_bucket{{{labels}}} {below}")
            total = sum(math.floor(c) for _, c in observed)
            labels = f'model_name="{m}",version="{version}",api="predict"'
            out.append(f":trainserve:proxy:request_latency_count{{{labels}}} {total}")
            out.append(f":trainserve:proxy:request_latency_sum{{{labels}}} {sum(mi * c for mi, c in observed)}")
        cand = f'model_name="{m}",version="{self.candidate}"'
        for outcome in ("compared", "error", "dropped_queue_full"):
            out.append(
                f':trainserve:proxy:shadow_requests{{{cand},outcome="{outcome}"}} {math.floor(self.shadow[outcome])}'
            )
        out.append(f":trainserve:proxy:shadow_pairs{{{cand}}} {math.floor(self.shadow['pairs'])}")
        out.append(f":trainserve:proxy:shadow_classified_pairs{{{cand}}} {math.floor(self.shadow['pairs'])}")
        out.append(f":trainserve:proxy:shadow_flips{{{cand}}} {math.floor(self.shadow['flips'])}")
        return out


class StandInProxy:
    """An HTTP server whose /monitoring/proxy/metrics is the proxy's page for every model added; each
    scrape is a tick."""

    def __init__(self):
        self.traffic: dict[str, Traffic] = {}
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path != "/monitoring/proxy/metrics":  # the serving job's scrape: nothing of ours
                    self.send_response(200)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                with outer.lock:
                    for model in outer.traffic.values():
                        model.tick()
                    body = ("\n".join(line for t in outer.traffic.values() for line in t.lines()) + "\n").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.target = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(self, model: str, traffic: Traffic) -> Traffic:
        traffic.model = model
        with self.lock:
            self.traffic[model] = traffic
        return traffic

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def watched(tmp_path_factory):
    """(stand-in proxy, real Prometheus scraping it every 250 ms with the repository's config and rules)."""
    root = tmp_path_factory.mktemp("rollout-prometheus")
    proxy = StandInProxy()
    # The repository's scrape config: its serving job finds an empty page, its proxy job the stand-in's.
    prometheus = Prometheus(root, proxy.target, proxy=proxy.target, interval="250ms")
    try:
        prometheus.wait_scraped(2)
        yield proxy, prometheus
    finally:
        prometheus.stop()
        proxy.stop()


class AppliedServer:
    def wait_available(self, model, version, wait):
        pass

    def wait_label(self, model, label, version, wait):
        pass


def site(tmp_path: Path, model: str) -> tuple[Path, Path]:
    """Model `model`: version 1 stable, version 2 the candidate; returns (config, candidate's eval report)."""
    base = tmp_path / "models" / model
    for version in (1, 2):
        (base / str(version)).mkdir(parents=True)
        (base / str(version) / "saved_model.pb").write_bytes(b"graph %d" % version)
    config = tmp_path / "rollout" / "models.config"
    config.parent.mkdir()
    for version in (1, 2):
        stage_candidate(CandidateConfig(config, model, str(base), version, "unused:1", 1), AppliedServer())
        report = compared_with(eval_report(base / str(version), model=model), None if version == 1 else 1)
        path = write(report, tmp_path / f"report-{version}.json")
        if version == 1:
            promote(PromoteConfig(config, path))
    return config, path


def rollout_args(config: Path, report: Path, prometheus: Prometheus, *more: str, plan: str = SHORT) -> list[str]:
    return [
        "rollout",
        *("--config", str(config), "--candidate", "2", "--report", str(report)),
        *("--routing-file", str(config.parent / "routing.json"), "--prometheus", prometheus.url),
        *("--plan", plan, "--interval", "0.25", "--gate-min-requests", "20"),
        *more,
    ]


def events(config: Path) -> list[dict]:
    return [e for e in read_history(history_path(config)) if e.get("action") == "rollout"]


def labels(config: Path) -> Rollout:
    return Rollout.of(read_config(config).model_config_list.config[0])


def test_a_candidate_that_flips_beyond_the_budget_stops_at_the_shadow_step(watched, tmp_path, capsys):
    proxy, prometheus = watched
    config, report = site(tmp_path, "flipping")
    traffic = proxy.add("flipping", Traffic(config.parent / "routing.json", 1, 2, flip_share=0.2))
    assert main(rollout_args(config, report, prometheus)) == 1
    assert "flip_rate: flips" in capsys.readouterr().out
    history = events(config)
    assert [e["step"] for e in history if e["event"] == "step"] == [0]
    assert not [k for k in traffic.requests if k[2] == "canary"]  # no client ever got its answer
    assert labels(config) == Rollout(stable=1)


def test_too_few_requests_hold_then_pause_and_a_rerun_resumes_the_same_step(watched, tmp_path, capsys):
    proxy, prometheus = watched
    config, report = site(tmp_path, "quiet")
    traffic = proxy.add("quiet", Traffic(config.parent / "routing.json", 1, 2, flowing=False))
    assert main(rollout_args(config, report, prometheus, "--max-hold", "0.5", plan=SHORT)) == 75
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "paused at step 1 (shadow 100% 1s)" in err and "fewer than --gate-min-requests 20" in err, err
    route = read_routing(config.parent / "routing.json").route("quiet")
    assert (route.shadow_percent, route.canary_percent) == (0, 0)  # held on stable (no shadow), never advanced
    traffic.flowing = True
    assert main(rollout_args(config, report, prometheus, plan=SHORT)) == 0
    history = events(config)
    assert [e["event"] for e in history].count("start") == 1
    assert [e["step"] for e in history if e["event"] == "step"] == [0, 1]  # the paused step resumed, not re-entered
    paused = next(i for i, e in enumerate(history) if e["event"] == "paused")
    resumed = history[paused + 1]
    assert (resumed["event"], resumed["step"], resumed["after"]) == ("resumed", 0, "a pause")
    assert resumed["counters"]["counts"] == last_counts(history[:paused])


def last_counts(history: list[dict]) -> dict:
    """The step's counts as the history last recorded them (its STEP record, or a CHECK whose state changed)."""
    kept = [e.get("state") or e.get("counters") for e in history if e["event"] in ("step", "check")]
    return [state for state in kept if state][-1]["counts"]


def test_a_paused_step_resumes_with_its_counts(watched, tmp_path):
    """A rerun after a pause continues the step's counts (one anytime-valid sequence, its alpha spent once), not
    a fresh origin: what the step saw before the pause counts towards its verdict."""
    proxy, prometheus = watched
    config, report = site(tmp_path, "resumed")
    proxy.add("resumed", Traffic(config.parent / "routing.json", 1, 2))
    unreachable = ("--gate-min-requests", str(10**9), "--max-hold", "1")  # every check unknown: it holds, pauses
    assert main(rollout_args(config, report, prometheus, *unreachable)) == 75
    paused_at = len(events(config))
    before = last_counts(events(config))
    assert before["shadow_compared"] > 0  # counted before the pause
    assert main(rollout_args(config, report, prometheus)) == 0
    after = events(config)[paused_at:]
    assert after[0]["event"] == "resumed" and after[0]["counters"]["counts"] == before
    first_look = next(e for e in after if e["event"] == "check")
    assert first_look["counts"]["shadow_compared"] >= before["shadow_compared"]


def test_a_killed_controller_resumes_its_step_from_the_history(watched, tmp_path, caplog):
    """Killed while holding at the 5 % step (no candidate requests flow then), a new controller resumes that step."""
    proxy, prometheus = watched
    config, report = site(tmp_path, "killed")
    traffic = proxy.add("killed", Traffic(config.parent / "routing.json", 1, 2))
    original = traffic.tick

    def frozen_at_canary():
        route = read_routing(traffic.routing).route("killed")
        traffic.flowing = not (route and route.canary_percent > 0) or getattr(traffic, "released", False)
        original()

    traffic.tick = frozen_at_canary
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainserve", *rollout_args(config, report, prometheus, plan=SHORT)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        prometheus.wait_for(
            lambda: [e for e in events(config) if e["event"] == "check" and e["step"] == 1], "a check at step 2"
        )
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    traffic.released = True
    caplog.set_level(logging.INFO, logger="trainserve.rollout.controller")
    assert main(rollout_args(config, report, prometheus, plan=SHORT)) == 0
    assert "resuming step 2 (5% 1s)" in caplog.text
    history = events(config)
    assert [e["event"] for e in history].count("start") == 1
    assert [e["step"] for e in history if e["event"] == "step"] == [0, 1]  # step 2 entered once, then resumed
    assert labels(config) == Rollout(stable=2, previous=1)
    # every look is on the record: the queries, their values, the step's counts, the decision
    last = [e for e in history if e["event"] == "check"][-1]
    assert (last["step"], last["decision"]) == (1, "advance") and last["counts"]["canary_requests"] >= 20
    assert last["queries"]["stable_errors"]["value"] == 0.0
    assert ':trainserve:proxy:request_count{job="proxy",' in last["queries"]["stable_errors"]["query"]
    # counted per replica, from the same counters for both versions: stable's calls on its route too
    assert last["counts"]["stable_requests"] > last["counts"]["canary_requests"] and "unjudged" not in last
    # promote's own history line, then the rollout's end; the model is no longer routed
    whole = read_history(history_path(config))
    assert [e["action"] for e in whole[-2:]] == ["promote", "rollout"] and whole[-1]["event"] == "promoted"
    assert read_routing(config.parent / "routing.json").route("killed") is None
