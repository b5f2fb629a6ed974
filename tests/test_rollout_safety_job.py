"""The k8s rollout Job retried after a newer version was published: pod 1 stages version 2, evaluates it and rolls it
out until it is killed at the 25 % step; version 3 is published; pod 2 runs the same commands again (the `candidate`
step with --skip-during-rollout, the eval writing its own pod's report, the controller). Version 2 is judged to the
end and promoted on the report its rollout began on; nothing of version 3 is staged or promoted. The judging is the
real controller's, on a real Prometheus scraping a stand-in proxy (test_rollout_controller.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from reports import compared_with, eval_report, write
from test_rollout_controller import AppliedServer, Traffic, events, labels, watched  # noqa: F401 (a fixture)

from conftest import REPO
from trainserve.cli import main
from trainserve.proxy.routing import read_routing
from trainserve.rollout.config import CandidateConfig, PromoteConfig
from trainserve.rollout.config_file import history_path, read_config
from trainserve.rollout.history import read_history
from trainserve.rollout.labels import Rollout
from trainserve.rollout.steps import promote, stage_candidate

pytestmark = pytest.mark.integration  # a Prometheus process, a controller process


def test_a_retried_rollout_job_resumes_the_version_it_was_rolling_out(watched, tmp_path):  # noqa: F811
    proxy, prometheus = watched
    base, config = tmp_path / "models" / "m-job", tmp_path / "rollout" / "models.config"
    config.parent.mkdir()
    for version in (1, 2):
        (base / str(version)).mkdir(parents=True)
        (base / str(version) / "saved_model.pb").write_bytes(b"graph %d" % version)
    stage_candidate(CandidateConfig(config, "m-job", str(base), 1, "unused:1", 1), AppliedServer())
    promote(PromoteConfig(config, write(compared_with(eval_report(base / "1", "m-job"), None), tmp_path / "r1.json")))
    traffic = proxy.add("m-job", Traffic(config.parent / "routing.json", 1, 2))
    ticked = traffic.tick

    def frozen_at_canary():  # pod 1 is killed in its 25 % step: nothing lets that step end
        route = read_routing(traffic.routing).route("m-job")
        traffic.flowing = not (route and route.canary_percent > 0) or getattr(traffic, "released", False)
        ticked()

    traffic.tick = frozen_at_canary

    def pod(name: str) -> list[str]:
        """The Job's `candidate` and `eval` steps; returns the `rollout` step's command line."""
        staged = CandidateConfig(config, "m-job", None, None, "unused:1", 1, skip_during_rollout=True)
        stage_candidate(staged, AppliedServer())
        candidate = labels(config).candidate
        report = compared_with(eval_report(base / str(candidate), "m-job"), 1) | {"created": f"at {name}"}
        path = write(report, tmp_path / f"{name}.json")  # --report=/reports/$(POD_NAME).json
        return [
            *("rollout", "--config", str(config), "--report", str(path), "--sticky-header", "x-user"),
            *("--routing-file", str(config.parent / "routing.json"), "--prometheus", prometheus.url),
            *("--plan", "shadow 1s, 25% 1s, 100%", "--interval", "0.25", "--gate-min-requests", "20"),
        ]

    argv = pod("rollout-v2-pod1")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen([sys.executable, "-m", "trainserve", *argv], env=env, stderr=subprocess.DEVNULL)
    try:
        prometheus.wait_for(lambda: [e for e in events(config) if e.get("step") == 1], "pod 1 at its 25 % step")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    (base / "3").mkdir()
    (base / "3" / "saved_model.pb").write_bytes(b"graph 3")  # published while version 2 is rolled out

    argv = pod("rollout-v2-pod2")
    assert labels(config) == Rollout(stable=1, candidate=2)  # the retry staged nothing
    traffic.released = True
    assert main(argv) == 0

    assert labels(config) == Rollout(stable=2, previous=1)
    assert 3 not in read_config(config).model_config_list.config[0].model_version_policy.specific.versions
    history = read_history(history_path(config))
    (start,) = [e for e in history if e.get("event") == "start"]
    (promoted,) = [e for e in history if e.get("action") == "promote" and e["after"].get("stable") == 2]
    assert promoted["report"] == start["report"]
    assert start["report"].endswith("rollout-v2-pod1.json") and promoted["report_sha256"] == start["report_sha256"]
    assert (start["sticky_header"], start["sticky_salt"]) == ("x-user", "m-job:2")
    assert [e["step"] for e in events(config) if e["event"] == "step"] == [0, 1]  # judged to the end, once each
