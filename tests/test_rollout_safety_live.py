"""A rollback and an abort cost no request, on real parts: serve-local polling the config every second, two replicas
of the proxy following the routing file, a real Prometheus scraping both, and clients calling `stable`
through both replicas all along. Replica b reads late, as one whose 10 s poll comes after the server's unload: from
the moment it runs the 25 % step its next read of the routing file is held until the controller says it waits for
the replicas (a controller that does not wait never says so; the test then lets b send a canary call to the unloaded
version first: NOT_FOUND). Each rollout's candidate is staged by the controller itself, once both replicas route the
model. A rollback from a 25 % step (promotion refused: the report was rewritten since the start) and an abort of a
killed controller's 25 % step hold the route, wait for both replicas, and only then drop the label: no call fails."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
from reports import compared_with, eval_report, write
from rollout_live import Applied

from conftest import MONITORING, REPO, install_version
from prometheus_server import Prometheus
from serving_fixtures import IMAGES, InProcessServer, predict_request, running_proxy, stubs
from trainserve.cli import build_parser, main
from trainserve.client import ServingClient
from trainserve.options import config_from_args
from trainserve.proxy.routing import read_routing
from trainserve.rollout.config import CandidateConfig, PromoteConfig
from trainserve.rollout.config_file import history_path, read_config
from trainserve.rollout.controller import Controller
from trainserve.rollout.history import read_history
from trainserve.rollout.labels import Rollout
from trainserve.rollout.prometheus import Prometheus as PrometheusClient
from trainserve.rollout.rollout_config import RolloutConfig
from trainserve.rollout.steps import promote, stage_candidate

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("rollout-live")]


class Clients:
    """Callers through both replicas: of `stable` (each answer's version or error code kept), and naming no version
    through the first (kept apart, each with the larger canary share that replica ran as the call began or ended:
    a routed model's version-less calls are its `stable` calls, a proxy default)."""

    def __init__(self, proxies: list):
        self.answers, self.errors, self.versionless = [], [], []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._call, args=(p, "stable"), daemon=True) for p in proxies]
        self.threads.append(threading.Thread(target=self._call, args=(proxies[0], None), daemon=True))
        for thread in self.threads:
            thread.start()

    def _call(self, proxy, label: str | None) -> None:
        predict, _ = stubs(type("T", (), {"target": f"127.0.0.1:{proxy.port}"}))
        request = predict_request(label=label, images=IMAGES)
        while not self.stop.is_set():
            before = share_of(proxy)
            try:
                version = predict.Predict(request, timeout=30).model_spec.version.value
            except grpc.RpcError as exc:
                version = exc.code().name
            share = max(before, share_of(proxy))  # the routing may change while the call is routed
            if label is None:
                self.versionless.append((version, share))
            else:
                (self.answers if isinstance(version, int) else self.errors).append(version)
            self.stop.wait(0.005)  # pacing, not synchronisation

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)


def share_of(proxy) -> float:
    route = proxy.router.routing.route("m")
    return route.canary_percent if route else 0.0


class LateReplica:
    """A replica whose routing reads are held from `hold()` until the controller logs that it waits for the proxy's
    replicas (or `release()`)."""

    def __init__(self, proxy):
        self.proxy, self.reads = proxy, threading.Event()
        self.reads.set()
        poll = proxy.router.poll
        proxy.router.poll = lambda: (self.reads.wait(), poll())[1]
        waits = self

        class Said(logging.Handler):
            def emit(self, record):
                if "waiting for the proxy's replicas" in record.getMessage():
                    waits.reads.set()

        self.handler = Said(logging.INFO)
        logging.getLogger("trainserve.rollout.follow").addHandler(self.handler)

    def hold(self) -> None:
        assert self.proxy.router.routing.route("m").canary_percent == 25  # it runs the canary step
        self.reads.clear()

    def canary_calls(self) -> int:
        return sum(n for key, n in list(self.proxy.metrics.requests.items()) if key[4] == "canary")

    def release(self) -> None:
        self.reads.set()

    def close(self) -> None:
        self.release()
        logging.getLogger("trainserve.rollout.follow").removeHandler(self.handler)


@pytest.fixture(scope="module")
def site(model_versions, tmp_path_factory):
    """Model m: version 1 stable, version 2 published (the same weights); serve-local, two proxy replicas, Prometheus
    scraping all three, clients through both replicas."""
    root = tmp_path_factory.mktemp("rollout-safety")
    base = root / "models" / "m"
    for version in (1, 2):
        install_version(model_versions[0], base, version)
    config = root / "rollout" / "models.config"
    config.parent.mkdir()
    stage_candidate(CandidateConfig(config, "m", str(base), 1, "unused:1", 1), Applied())
    promote(PromoteConfig(config, write(compared_with(eval_report(base / "1"), None), root / "report-1.json")))
    (root / "monitoring.config").write_text(MONITORING)
    server = InProcessServer(
        f"--monitoring_config_file={root / 'monitoring.config'}",
        f"--model_config_file={config}",
        "--model_config_file_poll_wait_seconds=1",
        "--allow_version_labels_for_unavailable_models",
    )
    routing = config.parent / "routing.json"
    proxies, prometheus, clients = [], None, None
    try:
        server.wait_available("m", 1)
        for name in "ab":
            proxies.append(
                running_proxy(
                    server, root / "captures" / name, sampling_rate=0.0, routing_file=routing, routing_poll_seconds=0.2
                )
            )
        late = LateReplica(proxies[1])
        prometheus = Prometheus(
            root, f"127.0.0.1:{server.rest_port}", proxy=[f"127.0.0.1:{p.rest_port}" for p in proxies]
        )
        prometheus.wait_scraped(2)
        prometheus.wait_for(lambda: len(prometheus.query('up{job="proxy"} == 1')) == 2, "both replicas scraped")
        clients = Clients(proxies)
        report = write(compared_with(eval_report(base / "2"), 1) | {"server": server.target}, root / "report-2.json")
        yield config, report, server, prometheus, clients, late
    finally:
        if proxies[1:]:
            late.close()
        if clients is not None:
            clients.close()
        if prometheus is not None:
            prometheus.stop()
        for proxy in proxies:
            proxy.stop(5)
        assert server.stop() == 0


def rollout_args(config: Path, report: Path, server, prometheus, plan: str, *more: str) -> list[str]:
    return [
        *("rollout", "--config", str(config), "--candidate", "2", "--report", str(report)),
        *("--routing-file", str(config.parent / "routing.json"), "--prometheus", prometheus.url),
        *("--server", server.target, "--wait", "60", "--plan", plan, "--interval", "0.25"),
        *("--gate-min-requests", "10", "--gate-max-slow-increase", "1"),
        *more,
    ]


def finished_cleanly(config: Path, server, prometheus, clients: Clients, late: LateReplica) -> None:
    """Once version 2 is unloaded and the late replica was let read (or sent one more canary call first): stable
    untouched, the model no longer routed, version 2's answers seen, and no client call failed."""
    server.wait_for(lambda: server.versions("m").get(2) in (None, "END"), "version 2 unloaded")
    calls = late.canary_calls()
    prometheus.wait_for(lambda: late.reads.is_set() or late.canary_calls() > calls, "replica b let read, or a call")
    late.release()
    assert Rollout.of(read_config(config).model_config_list.config[0]) == Rollout(stable=1)
    assert read_routing(config.parent / "routing.json").route("m") is None
    assert 2 in clients.answers, "the canary never answered a client"
    assert not clients.errors, clients.errors[:5]


def test_a_rollback_from_a_canary_step_costs_no_request(site):
    config, report, server, prometheus, clients, late = site
    original = report.read_bytes()
    rewritten = []

    def sleep(seconds: float) -> None:  # a retried eval rewrites the report while the 25 % step runs
        route = late.proxy.router.routing.route("m")
        if not rewritten and route and route.canary_percent:
            report.write_bytes(original.replace(b'"created": "', b'"created": "rewritten '))
            rewritten.append(True)
            late.hold()
        time.sleep(seconds)

    argv = rollout_args(config, report, server, prometheus, "25% 2s, 100%")
    rollout = config_from_args(RolloutConfig, build_parser().parse_args(argv))
    outcome = Controller(rollout, PrometheusClient(prometheus.url), ServingClient(server.target), sleep=sleep).run()
    report.write_bytes(original)
    assert rewritten and not outcome.promoted and "rewritten since" in outcome.said, outcome
    finished_cleanly(config, server, prometheus, clients, late)


def test_an_abort_of_a_killed_controllers_canary_step_costs_no_request(site):
    config, report, server, prometheus, clients, late = site
    seen = len(clients.answers)
    argv = rollout_args(config, report, server, prometheus, "25% 10m, 100%")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen([sys.executable, "-m", "trainserve", *argv], env=env, stderr=subprocess.DEVNULL)
    try:
        prometheus.wait_for(lambda: 2 in clients.answers[seen:], "the canary's answer to a client")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert read_routing(config.parent / "routing.json").route("m").canary_percent == 25  # left in force
    prometheus.wait_for(lambda: late.proxy.router.routing.route("m").canary_percent == 25, "replica b at 25 %")
    late.hold()
    assert main([*argv, "--abort", "--reason", "paged"]) == 1
    events = [e["event"] for e in read_history(history_path(config)) if e.get("action") == "rollout"]
    assert events[-2:] == ["rollback", "rolled-back"]
    finished_cleanly(config, server, prometheus, clients, late)


def test_clients_naming_no_version_were_answered_by_stable_throughout(site):
    """Run after the two rollouts above, on what the version-less callers got during them (a candidate staged by the
    controller only once both replicas routed the model): stable, or the candidate only within a canary share."""
    *_, clients, _ = site
    strays = [(version, share) for version, share in clients.versionless if version != 1 and share == 0]
    assert clients.versionless and not strays, strays[:5]
