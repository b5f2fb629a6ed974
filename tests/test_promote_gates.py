"""Promote re-derives its decision from the report's evidence: the schema, the gates judged again from the
numbers, the baseline against the config's stable, the version's files, the data's provenance, the whole
split, the server. Each refusal is one line and rewrites nothing; `--override CHECK --reason TEXT` passes it on
the record, and nothing of the kind comes from the environment. A replay report given beside it (--replay) has
its flip-rate gate judged again from its flip matrix."""

from __future__ import annotations

import hashlib
import json

import pytest
from reports import compared_with, eval_report, replay_report, write

from trainserve.cli import main
from trainserve.errors import TrainserveError
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
def site(tmp_path):
    """Model m: version 1 stable (a first rollout), version 2 the candidate; returns the config path."""
    for version in (1, 2, 3):
        (tmp_path / "models" / "m" / str(version)).mkdir(parents=True)
        (tmp_path / "models" / "m" / str(version) / "saved_model.pb").write_bytes(b"graph %d" % version)
    config = tmp_path / "rollout" / "models.config"
    config.parent.mkdir()
    stage(config, 1)
    promote(PromoteConfig(config, write(compared_with(report_of(config, 1), None), tmp_path / "first.json")))
    stage(config, 2)
    return config


def stage(config, version):
    base = str(config.parent.parent / "models" / "m")
    stage_candidate(CandidateConfig(config, "m", base, version, "unused:1", 1), AppliedServer())


def report_of(config, version, **kwargs) -> dict:
    return eval_report(config.parent.parent / "models" / "m" / str(version), **kwargs)


def good(config) -> dict:
    """The candidate's report as eval writes it: its own split, whole, compared with stable (version 1)."""
    return compared_with(report_of(config, 2), 1)


def _edited(**changes):
    def edit(report, config):
        for dotted, value in changes.items():
            *path, last = dotted.split(".")
            node = report
            for key in path:
                node = node[int(key)] if key.isdigit() else node[key]
            node[last] = value

    return edit


def _republished(report, config):
    (config.parent.parent / "models" / "m" / "2" / "saved_model.pb").write_bytes(b"another graph")


def _tampered(report, config):
    report["metrics"]["accuracy"] = report["gates"][0]["value"] = 0.5  # below 0.9, while the gate says passed


REFUSED = [
    pytest.param(lambda r, c: r.update(gates=[]), "gates", "applied no gate", id="no-gate"),
    pytest.param(_tampered, "gates", "says passed=True but its numbers say False", id="tampered-gate"),
    pytest.param(_edited(**{"data_check.overlaps_training": True}), "gates", "holds rows version 2", id="overlap"),
    pytest.param(
        lambda r, c: r.update(compared_with(report_of(c, 2), 3)), "baseline", "compared with version 3", id="other-base"
    ),
    pytest.param(lambda r, c: r.update(report_of(c, 2)), "baseline", "compared with no version", id="uncompared"),
    pytest.param(
        lambda r, c: r.update(compared_with(report_of(c, 2), None)), "baseline", "found no baseline", id="no-base"
    ),
    pytest.param(
        lambda r, c: r.update(compared_with(report_of(c, 2), 1, gate="significance")),
        "bound",
        "has no bound-based gate (only accuracy not worse 0.05 vs version 1: each passes on absence of evidence)",
        id="not-significantly-worse-only",
    ),
    pytest.param(
        lambda r, c: r.update(gates=r["gates"][:1]),
        "bound",
        "has no bound-based gate (no gate on the comparison)",
        id="comparison-ungated",
    ),
    pytest.param(_republished, "files", "are not the ones it evaluated", id="republished"),
    pytest.param(_edited(**{"evidence.version.files_sha256": None}), "files", "names no SHA-256", id="no-files"),
    pytest.param(_edited(**{"evidence.kind": "unverified"}), "evidence", "its evidence is unverified", id="unverified"),
    pytest.param(_edited(**{"evidence.baseline.rows": "unknown"}), "evidence", "may be biased", id="baseline-rows"),
    pytest.param(_edited(**{"evidence.partial": True, "settings.limit": 5}), "partial", "--limit 5", id="partial"),
]


@pytest.mark.parametrize(("edit", "check", "fragment"), REFUSED)
def test_each_refusal_is_one_line_rewrites_nothing_and_has_an_override(site, capsys, edit, check, fragment):
    report = good(site)
    edit(report, site)
    path = write(report, site.parent / "candidate.json")
    before, history = site.read_bytes(), history_path(site).read_bytes()
    assert main(["promote", "--config", str(site), "--report", str(path)]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("trainserve promote: error:") and fragment in line, line
    assert f"--override {check} --reason TEXT" in line, line
    assert site.read_bytes() == before and history_path(site).read_bytes() == history

    assert main(["promote", "--config", str(site), "--report", str(path), "--override", check, "--reason", "why"]) == 0
    assert f"promoted OVERRIDING {check} (reason: why)" in capsys.readouterr().out
    entry = read_history(history_path(site))[-1]
    assert (entry["overridden"], entry["reason"], entry["after"]["stable"]) == ([check], "why", 2)


def test_a_good_report_promotes_and_the_history_digests_the_bytes_judged(site, capsys):
    path = write(good(site), site.parent / "candidate.json")
    assert main(["promote", "--config", str(site), "--report", str(path)]) == 0
    assert capsys.readouterr().out.startswith("promoted: model m: stable -> 2")
    entry = read_history(history_path(site))[-1]
    assert entry["report_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert (entry["overridden"], entry["reason"], entry["passed"], entry["evidence"]) == ([], None, True, "own-split")
    assert entry["gates"] == ["accuracy >= 0.9: passed", "accuracy max drop 0.03 vs version 1: passed"]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param(lambda r: json.dumps({**r, "passed": "false"}), "at passed: 'false' is not of type", id="str"),
        pytest.param(lambda r: json.dumps({**r, "gates": [{}]}), "at gates/0", id="empty-gate"),
        pytest.param(lambda r: json.dumps(r).replace('"loss": 0.3', '"loss": NaN'), "NaN is not a", id="nan"),
        pytest.param(lambda r: json.dumps({"model": "m", "version": 2, "passed": True}), "not a valid", id="old"),
        pytest.param(lambda r: "{not json", "is not strict JSON", id="not-json"),
    ],
)
def test_a_report_that_is_not_a_valid_document_is_refused(site, capsys, text, fragment):
    path = site.parent / "candidate.json"
    path.write_text(text(good(site)))
    before = site.read_bytes()
    assert main(["promote", "--config", str(site), "--report", str(path), "--override", "gates", "--reason", "x"]) == 2
    line = capsys.readouterr().err.strip()
    assert len(line.splitlines()) == 1 and fragment in line, line
    assert site.read_bytes() == before


def test_no_override_comes_from_the_environment(site, capsys, monkeypatch):
    report = good(site)
    _tampered(report, site)
    path = write(report, site.parent / "candidate.json")
    for name, value in {"FORCE": "1", "OVERRIDE": "gates", "REASON": "inherited"}.items():
        monkeypatch.setenv(f"TRAINSERVE_{name}", value)
    before = site.read_bytes()
    assert main(["promote", "--config", str(site), "--report", str(path)]) == 2
    assert "--override gates" in capsys.readouterr().err and site.read_bytes() == before


def test_an_override_needs_a_reason_and_a_known_check(site, capsys):
    path = write(good(site), site.parent / "candidate.json")
    assert main(["promote", "--config", str(site), "--report", str(path), "--override", "gates"]) == 2
    assert "expected --reason TEXT" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="2"):
        main(["promote", "--config", str(site), "--report", str(path), "--override", "all", "--reason", "x"])
    assert "expected one or more of gates, bound, baseline, files" in capsys.readouterr().err


def test_a_report_from_another_server_is_refused_when_promote_names_its_server(site):
    path = write(good(site), site.parent / "candidate.json")
    with pytest.raises(TrainserveError, match="made on serve-cpu:8500, not on other:8500"):
        promote(PromoteConfig(site, path, server="other:8500"), AppliedServer())
    promote(PromoteConfig(site, path, server="serve-cpu:8500"), AppliedServer())


def _tampered_replay(replay):
    flip_gate = next(g for g in replay["gates"] if g["kind"] == "max_flip_rate")
    flip_gate["passed"] = replay["passed"] = True  # 60 flips in 2000: the bound is above 0.02


def _errors(replay):
    """Item 2 of issue 45: the candidate unloaded early in the replay, 73 % of its requests NOT_FOUND; 4 flips in
    the pairs left would pass --max-flip-rate 0.02 on their own."""
    built = replay_report(2, 1, 4, errors={"candidate": {"NOT_FOUND": 1460}})
    replay.clear()
    replay.update(built)


def _errors_tampered(replay):
    _errors(replay)
    replay["gates"][0]["passed"] = replay["passed"] = True


REPLAY_REFUSED = [
    pytest.param(lambda r: None, 60, "flip rate 0.0300 (60 of 2000)", id="flips"),
    pytest.param(_tampered_replay, 60, "says passed=True but its counts say False", id="tampered"),
    pytest.param(lambda r: r["flips"].update(count=0), 60, "its flips say 0 of 2000", id="edited-count"),
    pytest.param(lambda r: r.update(gates=[]), 0, "applied no error gate", id="no-gate"),
    pytest.param(
        lambda r: r.update(gates=r["gates"][:1], passed=None), 0, "applied no flip-rate gate", id="no-flip-gate"
    ),
    pytest.param(_errors, 4, "error share candidate 1460 of 2000 (0.7300: NOT_FOUND 1460)", id="errors"),
    pytest.param(
        _errors_tampered, 4, "max error rate 0.01 says passed=True but its counts say False", id="errors-edited"
    ),
    pytest.param(lambda r: r["candidate"].update(version=3), 0, "version 3, not the candidate", id="other-version"),
    pytest.param(lambda r: r["baseline"].update(version=3), 0, "compared with version 3", id="other-baseline"),
    pytest.param(lambda r: r["settings"].update(limit=50), 0, "(--limit 50)", id="limit"),
    pytest.param(lambda r: r["capture"].update(shard="1/2"), 0, "(--shard 1/2)", id="shard"),
]


@pytest.mark.parametrize(("edit", "flips", "fragment"), REPLAY_REFUSED)
def test_a_replay_beside_the_report_is_judged_from_its_counts(site, capsys, edit, flips, fragment):
    report = write(good(site), site.parent / "candidate.json")
    replay = replay_report(2, 1, flips)
    edit(replay)
    path = write(replay, site.parent / "replay.json")
    promote_args = ["promote", "--config", str(site), "--report", str(report), "--replay", str(path)]
    before = site.read_bytes()
    assert main(promote_args) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"trainserve promote: error: replay report {path}:") and fragment in line, line
    assert "--override replay --reason TEXT" in line and site.read_bytes() == before

    assert main([*promote_args, "--override", "replay", "--reason", "flips reviewed"]) == 0
    entry = read_history(history_path(site))[-1]
    assert (entry["overridden"], entry["replay"]["report_sha256"]) == (["replay"], _sha256(path))


def test_a_replay_within_its_flip_budget_promotes_on_the_record(site):
    replay = replay_report(2, 1, flips=4)  # 4 of 2000: rate 0.002, bound about 0.004
    path = write(replay, site.parent / "replay.json")
    promote(PromoteConfig(site, write(good(site), site.parent / "candidate.json"), replay=path), AppliedServer())
    entry = read_history(history_path(site))[-1]
    assert entry["after"]["stable"] == 2 and entry["overridden"] == []
    assert entry["replay"]["flip_rate"] == 4 / 2000 and entry["replay"]["report_sha256"] == _sha256(path)
    assert 0.002 < entry["replay"]["flip_upper_bound"] < 0.02


def test_a_replay_that_is_not_a_replay_report_is_refused_before_anything(site, capsys):
    report = write(good(site), site.parent / "candidate.json")
    before = site.read_bytes()
    assert main(["promote", "--config", str(site), "--report", str(report), "--replay", str(report)]) == 2
    line = capsys.readouterr().err.strip()
    assert len(line.splitlines()) == 1 and "is not a valid trainserve replay report" in line, line
    assert site.read_bytes() == before


def test_candidate_and_promote_keep_a_logging_config_added_by_hand(site):
    """The generated config says to add `logging_config` by hand and that rollout keeps it: it does."""
    from trainserve.model_server_config import parse_model_config, render_model_config

    text = site.read_text()
    assert "logging_config" in text and "keep it" in text  # the header says how
    config = parse_model_config(site)
    logging = config.model_config_list.config[0].logging_config
    logging.sampling_config.sampling_rate = 0.25
    logging.log_collector_config.filename_prefix = "/captures/m"
    site.write_text(text.split("model_config_list")[0] + render_model_config(config))
    promote(PromoteConfig(site, write(good(site), site.parent / "candidate.json")), AppliedServer())
    stage(site, 3)
    kept = parse_model_config(site).model_config_list.config[0].logging_config
    assert (kept.sampling_config.sampling_rate, kept.log_collector_config.filename_prefix) == (0.25, "/captures/m")


def _sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
