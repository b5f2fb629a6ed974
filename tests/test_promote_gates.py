"""No gate, no promotion: `promote` refuses a report that applied no gate (rewriting nothing) unless --force,
which the history keeps; the history names the gates and the comparison's verdict a promotion rested on."""

from __future__ import annotations

import json

import pytest

from trainserve.cli import main
from trainserve.rollout.config import CandidateConfig, PromoteConfig
from trainserve.rollout.config_file import history_path
from trainserve.rollout.history import read_history
from trainserve.rollout.steps import promote, stage_candidate

pytestmark = pytest.mark.unit


class AppliedServer:
    """A server that has applied every change (the steps' waits return at once)."""

    def wait_available(self, model, version, wait):
        pass

    def wait_label(self, model, label, version, wait):
        pass


@pytest.fixture
def staged(tmp_path):
    """Model m with version 1 published and staged as the candidate; returns the config path."""
    (tmp_path / "models" / "m" / "1").mkdir(parents=True)
    config = tmp_path / "rollout" / "models.config"
    config.parent.mkdir()
    stage_candidate(CandidateConfig(config, "m", str(tmp_path / "models" / "m"), 1, "unused:1", 1), AppliedServer())
    return config


def write_report(path, gates, comparison=None):
    body = {
        "model": "m",
        "version": 1,
        "label": "candidate",
        "passed": True,
        "created": "now",
        "gates": gates,
        "metrics": {"accuracy": 0.5},
        "min_accuracy": None,
        "comparison": comparison,
    }
    path.write_text(json.dumps(body))
    return path


def test_a_report_without_a_gate_is_refused_and_nothing_is_rewritten(staged, capsys):
    report = write_report(staged.parent / "r.json", [])
    before, history = staged.read_bytes(), history_path(staged).read_bytes()
    assert main(["promote", "--config", str(staged), "--report", str(report)]) == 2
    line = capsys.readouterr().err.strip()
    assert len(line.splitlines()) == 1 and line.startswith("trainserve promote: error:"), line
    assert "applied no gate" in line and all(flag in line for flag in ("--min-accuracy", "--require", "--compare-with"))
    assert staged.read_bytes() == before and history_path(staged).read_bytes() == history


def test_an_older_report_without_the_gates_field_is_refused_too(staged, capsys):
    report = staged.parent / "old.json"
    report.write_text(json.dumps({"model": "m", "version": 1, "passed": True}))
    assert main(["promote", "--config", str(staged), "--report", str(report)]) == 2
    assert "applied no gate" in capsys.readouterr().err


def test_force_promotes_a_gateless_report_and_the_history_says_so(staged, caplog):
    change = promote(PromoteConfig(staged, write_report(staged.parent / "r.json", []), force=True))
    assert change.after.stable == 1
    entry = read_history(history_path(staged))[-1]
    assert entry["forced"] is True and entry["gates"] == []
    assert "applied no gate" in caplog.text and "--force" in caplog.text


def test_the_history_names_the_gates_and_the_verdict(staged):
    gates = [
        {"metric": "accuracy", "op": ">=", "threshold": 0.9, "value": 0.95, "passed": True},
        {
            "kind": "significance",
            "metric": "accuracy",
            "op": "not worse",
            "threshold": 0.05,
            "value": 0.4,
            "baseline_version": 3,
            "passed": True,
            "said": "...",
        },
    ]
    comparison = {"verdict_line": "v1 vs v3: no significant difference (p=0.4, ...)"}
    promote(PromoteConfig(staged, write_report(staged.parent / "r.json", gates, comparison)))
    entry = read_history(history_path(staged))[-1]
    assert entry["forced"] is False
    assert entry["gates"] == ["accuracy >= 0.9: passed", "accuracy not worse 0.05 vs version 3: passed"]
    assert entry["verdict"] == comparison["verdict_line"]
