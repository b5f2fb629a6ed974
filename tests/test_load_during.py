"""`trainserve load --during COMMAND`: one steady load on stable while a command publishes a new version into the
served model's directory and serve-local loads it. The phases must cover the whole load, the version change must
fall inside `during`, the answers counted must be the server's own count, and the timeline must add up to the
phases. No assertion depends on how much the load slowed: bench/soak_versions.py and a person read that."""

from __future__ import annotations

import json
import shlex
import sys

import pytest

from conftest import MONITORING, ServeLocal, assert_one_line_error, install_version, predict_count, run_cli
from trainserve.evaluation.load.report import validate_load_report
from trainserve.model_server_config import render_model_config, single_model_config

# serve-local and the CLI run as subprocesses; the module starts its server once (conftest.py)
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("load-during")]
CONCURRENCY = 2
# A publisher as training is one: the version is copied beside the others under a non-numeric name, then renamed.
PUBLISH = (
    "import os, shutil, sys; "
    "shutil.copytree(sys.argv[1], sys.argv[2] + '.tmp'); os.rename(sys.argv[2] + '.tmp', sys.argv[2])"
)


@pytest.fixture(name="served")
def served_fixture(model_versions, tmp_path):
    """serve-local with every version of m loaded as it appears, label stable on version 1."""
    base = tmp_path / "m"
    install_version(model_versions[0], base, 1)
    config = single_model_config("m", str(base))
    config.model_config_list.config[0].model_version_policy.all.SetInParent()
    config.model_config_list.config[0].version_labels["stable"] = 1
    (tmp_path / "models.config").write_text(render_model_config(config))
    (tmp_path / "monitoring.config").write_text(MONITORING)
    server = ServeLocal(
        f"--model_config_file={tmp_path / 'models.config'}",
        f"--monitoring_config_file={tmp_path / 'monitoring.config'}",
        "--allow_version_labels_for_unavailable_models",
        log_path=tmp_path / "serve-local.log",
    )
    server.wait_available("m", 1)
    yield server, base
    server.stop()


def load_during(server, command: str, out) -> object:
    return run_cli(
        "load", "--server", server.target, "--model", "m", "--label", "stable", "--concurrency", CONCURRENCY,
        "--batch-sizes", "4", "--during", command, "--before-s", "2", "--after-s", "2", "--bucket-s", "0.5",
        "--settle-timeout-s", "60", "--report", out / "during.json", "--plots", out,
    )  # fmt: skip


def test_load_during_a_version_load_reports_before_during_and_after(served, model_versions, tmp_path):
    server, base = served
    before = predict_count(server)
    command = shlex.join([sys.executable, "-c", PUBLISH, str(model_versions[1]), str(base / "2")])
    proc = load_during(server, command, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "during.json").read_text())
    validate_load_report(report)
    assert report["version"] == 1 and report["settled"] and report["command"]["exit_code"] == 0

    phases = report["phases"]
    for name in ("before", "during", "after"):
        assert phases[name]["requests"] > 0 and phases[name]["latency_ms"] is not None, name
        assert phases[name]["errors"] == {}, (name, phases[name]["errors"])
    assert phases["before"]["duration_s"] >= 2 and phases["after"]["duration_s"] >= 2
    start, end = phases["during"]["start_s"], phases["during"]["start_s"] + phases["during"]["duration_s"]
    assert phases["before"]["start_s"] + phases["before"]["duration_s"] == start
    assert phases["after"]["start_s"] == end
    available = [e for e in report["version_events"] if e["version"] == 2 and e["state"] == "AVAILABLE"]
    assert len(available) == 1 and start <= available[0]["t_s"] <= end, report["version_events"]
    assert all(e["version"] == 2 for e in report["version_events"]), "stable (v1) never changed state"

    answered = sum(p["requests"] for p in phases.values())
    served_count = predict_count(server) - before  # the server's own count of the load's requests
    assert served_count - CONCURRENCY <= answered <= served_count, "requests still in flight at the end aside"
    bucket = report["settings"]["bucket_s"]
    assert sum(p["throughput_rps"] for p in report["timeline"][:-1]) * bucket <= answered
    assert len(report["timeline"]) >= (phases["after"]["start_s"] + phases["after"]["duration_s"]) / bucket - 1
    assert "p99 during / before:" in proc.stdout and "v2 AVAILABLE" in proc.stdout
    assert (tmp_path / "during_timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_failing_command_fails_the_load_and_is_reported(served, tmp_path):
    server, _ = served
    proc = load_during(server, shlex.join([sys.executable, "-c", "raise SystemExit(3)"]), tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "during.json").read_text())
    assert report["command"]["exit_code"] == 3 and not report["settled"]
    assert report["phases"]["before"]["requests"] > 0 and report["phases"]["after"]["requests"] > 0


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--concurrency", "1,2"], "one --concurrency or --rate value"),
        (["--concurrency", "1", "--batch-sizes", "1,8"], "one --batch-sizes value"),
        (["--concurrency", "1", "--batch-sizes", "1", "--before-s", "0"], "--before-s 0: expected seconds > 0"),
    ],
)
def test_bad_during_flags_fail_in_one_line_before_any_request(flags, expected):
    proc = run_cli("load", "--server", "127.0.0.1:1", "--model", "m", "--during", "true", *flags)
    assert_one_line_error(proc, expected)


def test_a_command_that_does_not_exist_fails_in_one_line():
    flags = ["--concurrency", "1", "--batch-sizes", "1", "--during", "no-such-command-here --x"]
    proc = run_cli("load", "--server", "127.0.0.1:1", "--model", "m", *flags)
    assert_one_line_error(proc, "expected a command that exists")
