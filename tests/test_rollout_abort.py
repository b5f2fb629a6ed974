"""`trainserve rollout --abort` of a rollout killed in its canary step needs only the model's config, the routing
file and --reason: the replicas' leaving the canary is confirmed on the Prometheus the START record names. The real
controller, killed, on a real Prometheus scraping the stand-in proxy of test_rollout_controller.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from test_rollout_controller import Traffic, events, labels, rollout_args, site, watched  # noqa: F401 (a fixture)

from conftest import REPO
from trainserve.cli import main
from trainserve.proxy.routing import read_routing
from trainserve.rollout.labels import Rollout

pytestmark = pytest.mark.integration  # a Prometheus process, a controller process


def test_an_abort_without_prometheus_confirms_on_the_start_records(watched, tmp_path):  # noqa: F811
    proxy, prometheus = watched
    config, report = site(tmp_path, "paged")
    routing = config.parent / "routing.json"
    traffic = proxy.add("paged", Traffic(routing, 1, 2))
    ticked = traffic.tick

    def frozen_at_canary():  # the controller is killed in its 5 % step: nothing lets that step end
        route = read_routing(routing).route("paged")
        traffic.flowing = not (route and route.canary_percent > 0)
        ticked()

    traffic.tick = frozen_at_canary
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    argv = rollout_args(config, report, prometheus, plan="shadow 1s, 5% 10m, 100%")
    proc = subprocess.Popen([sys.executable, "-m", "trainserve", *argv], env=env, stderr=subprocess.DEVNULL)
    try:
        prometheus.wait_for(lambda: [e for e in events(config) if e.get("step") == 1], "the controller at its 5 % step")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert read_routing(routing).route("paged").canary_percent == 5  # left in force

    at_3_am = ["rollout", "--config", str(config), "--routing-file", str(routing), "--abort", "--reason", "paged"]
    assert main(at_3_am) == 1  # rolled back
    assert [e["event"] for e in events(config)][-2:] == ["rollback", "rolled-back"]
    assert labels(config) == Rollout(stable=1)
    assert read_routing(routing).route("paged") is None
