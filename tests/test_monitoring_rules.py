"""The alerting rules as code: Prometheus' own promtool checks monitoring/rules.yml and runs its unit cases, every
alert has a case where it fires and one where it stays silent, and the cases can fail (a weakened rule is caught)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from conftest import REPO, require

# The unit tests here: promtool runs as a subprocess; nothing imports TensorFlow.
MONITORING = REPO / "monitoring"
RULES = MONITORING / "rules.yml"
CASES = MONITORING / "tests" / "alerts_test.yml"


def promtool(*args: str) -> subprocess.CompletedProcess:
    require("promtool", shutil.which("promtool") is not None, "Debian's prometheus package checks the rules")
    return subprocess.run(["promtool", *args], capture_output=True, text=True, cwd=REPO, timeout=120)


def alerts(rules: dict) -> list[str]:
    return [rule["alert"] for group in rules["groups"] for rule in group["rules"] if "alert" in rule]


@pytest.mark.unit
def test_rules_and_scrape_configs_pass_promtool_check():
    for args in [("check", "rules", RULES), *(("check", "config", c) for c in sorted(MONITORING.glob("prom*.yml")))]:
        proc = promtool(*map(str, args))
        assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.integration
def test_promtool_unit_cases_pass():
    proc = promtool("test", "rules", str(CASES))
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.unit
def test_every_alert_has_a_case_that_fires_and_one_that_stays_silent():
    cases = [case for test in yaml.safe_load(CASES.read_text())["tests"] for case in test["alert_rule_test"]]
    names = alerts(yaml.safe_load(RULES.read_text()))
    assert len(names) >= 6 and len(set(names)) == len(names), names
    fires = {case["alertname"] for case in cases if case.get("exp_alerts")}
    silent = {case["alertname"] for case in cases if not case.get("exp_alerts")}
    assert set(names) <= fires, f"no firing case for {set(names) - fires}"
    assert set(names) <= silent, f"no silent case for {set(names) - silent}"
    assert fires | silent <= set(names), "cases for alerts the rules do not have"


@pytest.mark.integration
@pytest.mark.parametrize(
    "weaken",
    [
        pytest.param(("> 0.05", "> 0.5"), id="error-threshold-raised"),
        pytest.param(
            ("and trainserve:predict_slow:ratio_rate5m{}", "or trainserve:predict_slow:ratio_rate5m{}"),
            id="fast-burn-without-its-short-window",
        ),
        pytest.param(('error_code!="OK"', 'error_code="NONE"'), id="failed-loads-ignored"),
        pytest.param(('stable"}) > 0.02', 'stable"}) > 0.5'), id="canary-margin-raised"),
        pytest.param(
            ('status!~"OK|CANCELLED"', 'status!~"OK|INVALID_ARGUMENT|NOT_FOUND|CANCELLED"'),
            id="canary-rejections-ignored",
        ),
        pytest.param(('status!~"OK|CANCELLED"', 'status!~"OK"'), id="cancelled-counted-as-errors"),
        pytest.param(
            (
                "+ sum by (job, filename_prefix) (rate(:trainserve:capture:records_lost",
                "- sum by (job, filename_prefix) (rate(:trainserve:capture:records_lost",
            ),
            id="capture-losses-ignored",
        ),
    ],
)
def test_a_weakened_rule_fails_the_cases(weaken, tmp_path):
    """The harness can fail: the same cases against a rules file with one rule weakened."""
    old, new = weaken
    text = RULES.read_text()
    assert old in text, old
    (tmp_path / "tests").mkdir()
    (tmp_path / "rules.yml").write_text(text.replace(old, new))
    shutil.copy(CASES, tmp_path / "tests" / CASES.name)
    proc = promtool("test", "rules", str(tmp_path / "tests" / CASES.name))
    assert proc.returncode != 0 and "FAILED" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
