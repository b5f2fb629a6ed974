"""Killing the proxy mid-rollout loses no state: `trainserve proxy` runs as its own process in front of
serve-local, `trainserve rollout` moves its routing file, a real Prometheus scrapes both with the repository's
rules. At the first canary step the proxy is SIGKILLed: the controller holds while its target is down (it never
advances on counts it cannot complete), a new proxy on the same ports reads the routing file again and answers a
share of `stable` with the candidate, and the rollout goes on to promotion with a whole history. Every answer a
client got names a version the routing file named when the call began."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest
from reports import compared_with, eval_report, write
from rollout_live import Applied
from test_rollout_controller_live import FULL, roll_out

from conftest import MONITORING, free_port, install_version
from prometheus_server import Prometheus
from serving_fixtures import IMAGES, InProcessServer, predict_request, stubs
from trainserve.proxy.routing import read_routing
from trainserve.rollout.config import CandidateConfig, PromoteConfig
from trainserve.rollout.config_file import history_path, read_config
from trainserve.rollout.history import read_history
from trainserve.rollout.labels import Rollout
from trainserve.rollout.steps import promote, stage_candidate

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("rollout-live")]


class ProxyProcess:
    """`trainserve proxy` in its own process, following `routing` every 0.2 s; started on fixed ports, so that a
    new one takes the place of one killed."""

    def __init__(self, root: Path, server: InProcessServer, routing: Path, port: int, rest_port: int, name: str):
        self.log_path = root / f"{name}.log"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "trainserve", "proxy"]
                + ["--upstream", server.target, "--upstream-rest", f"127.0.0.1:{server.rest_port}"]
                + ["--port", str(port), "--rest-port", str(rest_port), "--sampling-rate", "0"]
                + ["--filename-prefix", str(root / "captures" / name)]
                + ["--routing-file", str(routing), "--routing-poll-seconds", "0.2"]
                + ["--shadow-shed-latency-margin", "inf"],  # as serving_fixtures.NO_LATENCY_SHED
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
            )

    def wait_listening(self, prometheus: Prometheus) -> None:
        """Its start-up line logged, which it writes once both ports listen."""
        prometheus.wait_for(lambda: self.proc.poll() is None and "proxy: gRPC on" in self.log(), "the proxy up")

    def log(self) -> str:
        return self.log_path.read_text()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        assert self.proc.wait(timeout=30) == -signal.SIGKILL

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=60)


class Clients:
    """One caller of `stable` through the proxy; each answer's version recorded with the candidate the routing file
    gave a share when the call began, and with the proxy's generation (0: the first, 1: its replacement). It stops
    calling once it got the canary's first answer, until `resume()`: the step then cannot have seen
    --gate-min-requests candidate requests, so it is still on when the proxy is killed."""

    def __init__(self, port: int, routing: Path):
        self.predict, _ = stubs(type("T", (), {"target": f"127.0.0.1:{port}"}))
        self.routing, self.answers, self.errors, self.generation = routing, [], [], 0
        self.stop, self.go, self.paused = threading.Event(), threading.Event(), threading.Event()
        self.go.set()
        self.thread = threading.Thread(target=self._call, daemon=True)
        self.thread.start()

    def _call(self) -> None:
        request = predict_request(label="stable", images=IMAGES)
        while not self.stop.is_set():
            self.go.wait()
            if self.stop.is_set():
                return
            route = read_routing(self.routing).route("m")
            named = {route.candidate} if route and route.canary_percent > 0 else set()
            try:  # waits for a proxy being replaced rather than failing at once
                answer = self.predict.Predict(request, timeout=60, wait_for_ready=True)
                self.answers.append((answer.model_spec.version.value, named, self.generation))
                if named and answer.model_spec.version.value in named and not self.paused.is_set():
                    self.go.clear()  # the canary answered: hold still until the proxy is replaced
                    self.paused.set()
            except grpc.RpcError as exc:
                self.errors.append((exc.code().name, named, self.generation))
            self.stop.wait(0.002)  # pacing, not synchronisation

    def resume(self) -> None:
        self.generation = 1
        self.go.set()

    def close(self) -> None:
        self.stop.set()
        self.go.set()
        self.thread.join(timeout=90)


def test_a_proxy_killed_at_a_canary_step_is_replaced_and_the_rollout_goes_on_to_promotion(
    model_versions, tmp_path, capsys
):
    base = tmp_path / "models" / "m"
    for version in (1, 2):  # 2: the same weights (no flips)
        install_version(model_versions[0], base, version)
    config = tmp_path / "rollout" / "models.config"
    config.parent.mkdir()
    stage_candidate(CandidateConfig(config, "m", str(base), 1, "unused:1", 1), Applied())
    promote(PromoteConfig(config, write(compared_with(eval_report(base / "1"), None), tmp_path / "report-1.json")))
    (tmp_path / "monitoring.config").write_text(MONITORING)
    server = InProcessServer(
        f"--monitoring_config_file={tmp_path / 'monitoring.config'}",
        f"--model_config_file={config}",
        "--model_config_file_poll_wait_seconds=1",
        "--allow_version_labels_for_unavailable_models",
    )
    routing, port, rest_port = config.parent / "routing.json", free_port(), free_port()
    proxies, prometheus, clients, controller, outcome = [], None, None, None, []
    try:
        server.wait_available("m", 1)
        proxies.append(ProxyProcess(tmp_path, server, routing, port, rest_port, "first"))
        prometheus = Prometheus(tmp_path, f"127.0.0.1:{server.rest_port}", proxy=f"127.0.0.1:{rest_port}")
        proxies[0].wait_listening(prometheus)
        prometheus.wait_scraped(2)
        clients = Clients(port, routing)
        controller = threading.Thread(
            target=lambda: outcome.append(roll_out(config, base, server, prometheus, 2, FULL)), daemon=True
        )
        controller.start()

        prometheus.wait_for(clients.paused.is_set, "the canary's first answer to a client")
        assert read_routing(routing).route("m").canary_percent == 5  # the first canary step, not yet judged
        proxies[0].kill()
        killed_at = len(read_history(history_path(config)))
        prometheus.wait_for(lambda: down_checks(config, killed_at), "the controller's check of the proxy's absence")
        down = down_checks(config, killed_at)
        assert read_routing(routing).route("m").canary_percent == 5  # held where it was

        proxies.append(ProxyProcess(tmp_path, server, routing, port, rest_port, "second"))
        proxies[1].wait_listening(prometheus)
        assert "m: candidate 2, shadow 100 %, canary 5 %" in proxies[1].log(), proxies[1].log()  # read at start
        clients.resume()
        controller.join(timeout=240)
        assert not controller.is_alive(), "the rollout did not end"
        out = capsys.readouterr().out
    finally:
        if clients is not None:
            clients.close()
        if prometheus is not None:
            prometheus.stop()
        for proxy in proxies:
            proxy.stop()
        assert server.stop() == 0

    assert outcome == [0] and out.startswith("promoted: model m: stable -> 2, previous -> 1"), out
    # it held, and said why: the proxy's target down, its counts kept (not re-based, not lost) while it was
    assert all(c["decision"] in ("watch", "hold") for c in down), down
    assert down[-1]["unjudged"] == f"proxy targets down (scrape job 'proxy'): 127.0.0.1:{rest_port}", down[-1]
    assert down[-1]["counts"]["canary_requests"] < 10, down[-1]  # too few to judge: held for the target, too
    events = [e for e in read_history(history_path(config)) if e.get("action") == "rollout"]
    assert [e["step"] for e in events if e["event"] == "step"] == [0, 1, 2]
    assert [e["event"] for e in events][0] == "start" and events[-1]["event"] == "promoted", events[-1]
    assert all(e["queries"] and e["decision"] for e in events if e["event"] == "check")
    assert Rollout.of(read_config(config).model_config_list.config[0]).stable == 2
    assert read_routing(routing).route("m") is None

    assert not clients.errors, clients.errors[:5]
    strays = [(v, named) for v, named, _ in clients.answers if v not in {1, 2} and v not in named]
    assert not strays, strays[:5]
    # the new proxy read the routing file again: the candidate answered its share before it was promoted
    assert any(v == 2 and named == {2} and generation == 1 for v, named, generation in clients.answers)


def down_checks(config: Path, after: int) -> list[dict]:
    """The controller's checks recorded since the kill, up to the first that holds, with the step's time up, on a
    look it could not judge (the proxy's target down): empty until that one is written."""
    checks = [e for e in read_history(history_path(config))[after:] if e.get("event") == "check"]
    held = [i for i, check in enumerate(checks) if check.get("unjudged") and check["decision"] == "hold"]
    return checks[: held[0] + 1] if held else []
