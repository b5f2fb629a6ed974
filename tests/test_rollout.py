"""Gated rollout: label moves, the config rewrite, refusals that rewrite nothing, the history, and
serving's side of TF Serving's label rule. (End to end against serve-local: test_e2e_rollout.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import test_serve_cpu_scripts as serve_cpu_scripts
from reports import compared_with, eval_report, write

from conftest import assert_one_line_error, run_cli
from trainserve.cli import main
from trainserve.errors import TrainserveError
from trainserve.model_server_config import parse_model_config
from trainserve.protos import model_server_config_pb2
from trainserve.rollout.config import CandidateConfig, PromoteConfig, RollbackConfig
from trainserve.rollout.config_file import history_path
from trainserve.rollout.history import read_history
from trainserve.rollout.labels import Rollout, apply_rollout
from trainserve.rollout.steps import promote, rollback, stage_candidate

# The unit tests here: the CLI subprocesses here are rollout's, which import no TensorFlow.
serving_image_box = serve_cpu_scripts.box  # a fixture: the serving image's paths under tmp_path


class FakeServer:
    """Answers as a server that has applied every write; records what the config said at each wait."""

    def __init__(self, config: Path):
        self.config, self.seen = config, []

    def wait_available(self, model, version, wait):
        self.seen.append(("available", version, self.config.read_text()))

    def wait_label(self, model, label, version, wait):
        self.seen.append((label, version, self.config.read_text()))


def labels_and_versions(config: Path, model: str = "m") -> tuple[dict, list[int]]:
    (served,) = [c for c in parse_model_config(config).model_config_list.config if c.name == model]
    return dict(served.version_labels), list(served.model_version_policy.specific.versions)


@pytest.fixture
def site(tmp_path):
    """A model base path with versions 1..3 published (empty dirs: rollout only looks at the names)."""
    for version in (1, 2, 3):
        (tmp_path / "models" / "m" / str(version)).mkdir(parents=True)
    return tmp_path


def stage(site, version=None, server=None) -> FakeServer:
    config = site / "rollout" / "models.config"
    config.parent.mkdir(exist_ok=True)
    server = server or FakeServer(config)
    stage_candidate(CandidateConfig(config, "m", str(site / "models" / "m"), version, "unused:1", 1), server)
    return server


def report(site, version, passed=True, model="m", name="eval.json") -> Path:
    """A report of the version on disk, compared with the config's stable where one exists (as eval writes it)."""
    body = eval_report(site / "models" / "m" / str(version), model, accuracy=0.95 if passed else 0.1)
    config = site / "rollout" / "models.config"
    stable = labels_and_versions(config)[0].get("stable") if config.exists() else None
    return write(compared_with(body, stable) if stable is not None else body, site / name)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("start", "step", "want"),
    [
        pytest.param(Rollout(), lambda r: r.with_candidate(1), Rollout(candidate=1), id="first-candidate"),
        pytest.param(Rollout(candidate=1), Rollout.promoted, Rollout(stable=1), id="first-promotion"),
        pytest.param(Rollout(1, None, 2), lambda r: r.with_candidate(3), Rollout(1, None, 3), id="replace-candidate"),
        pytest.param(Rollout(1, None, 3), Rollout.promoted, Rollout(3, 1, None), id="promote-keeps-previous"),
        pytest.param(Rollout(3, 1, 4), Rollout.promoted, Rollout(4, 3, None), id="promote-drops-oldest"),
        pytest.param(Rollout(3, 1, None), Rollout.rolled_back, Rollout(1, None, None), id="rollback"),
        pytest.param(Rollout(3, 1, 4), Rollout.rolled_back, Rollout(1, None, 4), id="rollback-keeps-candidate"),
    ],
)
def test_label_moves(start, step, want):
    assert step(start) == want


@pytest.mark.unit
@pytest.mark.parametrize(
    ("start", "step", "fragment"),
    [
        pytest.param(Rollout(stable=1), Rollout.promoted, "no candidate to promote", id="promote-nothing"),
        pytest.param(Rollout(stable=1), Rollout.rolled_back, "stable is version 1", id="rollback-nothing"),
        pytest.param(Rollout(stable=2), lambda r: r.with_candidate(2), "already stable", id="stage-stable"),
    ],
)
def test_label_moves_refused(start, step, fragment):
    with pytest.raises(TrainserveError, match=fragment):
        step(start)


@pytest.mark.unit
def test_policy_is_exactly_the_labelled_versions():
    model = model_server_config_pb2.ModelConfig(name="m", base_path="/m")
    model.model_version_policy.latest.num_versions = 3
    model.version_labels["canary"] = 4
    apply_rollout(model, Rollout(5, 4, 6))
    assert list(model.model_version_policy.specific.versions) == [4, 5, 6]
    assert dict(model.version_labels) == {"canary": 4, "stable": 5, "previous": 4, "candidate": 6}
    with pytest.raises(TrainserveError, match="label 'canary' names version 4, which this change would unload"):
        apply_rollout(model, Rollout(6, 5))
    del model.version_labels["canary"]
    apply_rollout(model, Rollout(5), loading=7)
    assert list(model.model_version_policy.specific.versions) == [5, 7] and "candidate" not in model.version_labels


@pytest.mark.unit
def test_candidate_loads_first_then_labels(site):
    server = stage(site)
    config = site / "rollout" / "models.config"
    (_, loading, first), (label, version, second) = server.seen
    assert loading == version == 3 and label == "candidate"
    assert 'key: "candidate"' not in first and "versions: 3" in first, "the label follows the load"
    assert labels_and_versions(config) == ({"candidate": 3}, [3])
    (entry,) = read_history(history_path(config))
    assert entry["action"] == "candidate" and entry["after"] == {"candidate": 3} and entry["before"] == {}
    assert config.read_text().startswith("# Written by trainserve")


class FailingLoad(FakeServer):
    """A server on which the staged version fails to load."""

    def wait_available(self, model, version, wait):
        super().wait_available(model, version, wait)
        raise TrainserveError(f"unused:1: model {model} version {version} failed to load: corrupt")


@pytest.mark.unit
def test_candidate_that_fails_to_load_leaves_the_config_as_it_was(site):
    config = site / "rollout" / "models.config"
    stage(site, version=1)
    promote(PromoteConfig(config, report(site, 1)))
    before, history = config.read_bytes(), history_path(config).read_bytes()
    server = FailingLoad(config)
    with pytest.raises(TrainserveError, match="version 3 failed to load"):
        stage(site, version=3, server=server)
    ((_, _, while_loading),) = server.seen
    assert "versions: 3" in while_loading, "the version was offered to the server"
    assert config.read_bytes() == before and history_path(config).read_bytes() == history


@pytest.mark.unit
def test_promote_rollback_and_history(site):
    config = site / "rollout" / "models.config"
    stage(site, version=1)
    first = promote(PromoteConfig(config, report(site, 1)))
    assert first.after == Rollout(stable=1) and labels_and_versions(config) == ({"stable": 1}, [1])
    stage(site, version=3)
    assert labels_and_versions(config) == ({"stable": 1, "candidate": 3}, [1, 3])
    promote(PromoteConfig(config, report(site, 3)))
    assert labels_and_versions(config) == ({"stable": 3, "previous": 1}, [1, 3])
    rollback(RollbackConfig(config, reason="bad answers"))
    assert labels_and_versions(config) == ({"stable": 1}, [1])
    history = read_history(history_path(config))
    assert [e["action"] for e in history] == ["candidate", "promote", "candidate", "promote", "rollback"]
    assert history[1]["report_sha256"] and history[1]["overridden"] == [] and history[-1]["reason"] == "bad answers"
    assert all(e["time"] and "@" in e["by"] for e in history)


@pytest.mark.unit
def test_an_override_promotes_a_failed_report_and_says_so(site, caplog):
    config = site / "rollout" / "models.config"
    stage(site, version=2)
    promote(PromoteConfig(config, report(site, 2, passed=False), override=("gates",), reason="hotfix, see INC-7"))
    assert labels_and_versions(config)[0] == {"stable": 2}
    entry = read_history(history_path(config))[-1]
    assert entry["overridden"] == ["gates"] and entry["reason"] == "hotfix, see INC-7" and entry["passed"] is False
    assert "OVERRIDDEN (gates, reason: hotfix, see INC-7)" in caplog.text and "accuracy" in caplog.text


def _bad_json(site):
    (site / "bad.json").write_text("{not json")
    return ["--report", site / "bad.json"]


def _version_gone(site):
    (site / "models/m/3").rename(site / "models/m/.gone")
    return ["--report", report(site, 3)]


def _config_broken(site):
    made = report(site, 3)
    (site / "rollout/models.config").write_text("model_config_list { config { nme: 1 } }")
    return ["--report", made]


REFUSALS = [
    pytest.param(lambda s: ["--report", report(s, 3, model="other")], "has no model 'other'", id="other-model"),
    pytest.param(lambda s: ["--report", report(s, 2)], "version 2, but the candidate is version 3", id="other-version"),
    pytest.param(lambda s: ["--report", report(s, 3, passed=False)], "accuracy >= 0.9 does not hold", id="failed"),
    pytest.param(lambda s: ["--report", s / "none.json"], "cannot be read", id="no-report"),
    pytest.param(_bad_json, "is not strict JSON", id="bad-json"),
    pytest.param(_version_gone, "version 3 is not on disk", id="not-on-disk"),
    pytest.param(_config_broken, "line 1", id="config-does-not-parse"),
]


@pytest.mark.unit
@pytest.mark.parametrize(("make_args", "fragment"), REFUSALS)
def test_promote_refusals_rewrite_nothing(site, capsys, make_args, fragment):
    config = site / "rollout" / "models.config"
    stage(site, version=1)
    promote(PromoteConfig(config, report(site, 1)))
    stage(site, version=3)
    args = make_args(site)
    before, history = config.read_bytes(), history_path(config).read_bytes()
    assert main(["promote", "--config", str(config), *map(str, args)]) == 2
    line = capsys.readouterr().err.strip()
    assert len(line.splitlines()) == 1 and line.startswith("trainserve promote: error:") and fragment in line, line
    assert config.read_bytes() == before and history_path(config).read_bytes() == history


@pytest.mark.unit
def test_rollback_and_candidate_refusals(site, capsys):
    config = site / "rollout" / "models.config"
    stage(site, version=1)
    promote(PromoteConfig(config, report(site, 1)))
    before = config.read_bytes()
    assert main(["rollback", "--config", str(config)]) == 2
    assert "no previous stable version is kept to roll back to (stable is version 1)" in capsys.readouterr().err
    assert main(["candidate", "--config", str(config), "--version", "7"]) == 2
    assert "version 7 is not on disk" in capsys.readouterr().err
    assert main(["promote", "--config", str(config), "--report", str(report(site, 1))]) == 2
    assert "has no candidate" in capsys.readouterr().err
    assert main(["rollback", "--config", str(site / "none.config")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert config.read_bytes() == before


@pytest.mark.unit
def test_nothing_new_to_stage(site):
    config = site / "rollout" / "models.config"
    stage(site)
    promote(PromoteConfig(config, report(site, 3)))
    with pytest.raises(TrainserveError, match=r"nothing new to stage: the newest version on disk \(3\)"):
        stage(site)


@pytest.mark.integration
def test_cli_help_and_one_line_errors(tmp_path):
    for command in ("candidate", "promote", "rollback"):
        proc = run_cli(command, "--help")
        assert proc.returncode == 0 and "--config" in proc.stdout, proc.stderr
    assert_one_line_error(run_cli("promote", "--config", tmp_path / "x"), "expected --report")


@pytest.mark.unit
def test_serving_refuses_labels_on_versions_not_available():
    """TF Serving's rule (ServerCore::UpdateModelVersionLabelMap), which serve-local follows."""
    from trainserve.serving.manager import ModelManager, State, VersionState

    def config(**labels):
        msc = model_server_config_pb2.ModelServerConfig()
        model = msc.model_config_list.config.add(name="m", base_path="/nowhere")
        model.version_labels.update(labels)
        return msc

    strict, lenient = ModelManager(), ModelManager(allow_unavailable_labels=True)
    with pytest.raises(TrainserveError, match="version 1 of model m, which is not currently available"):
        strict.configure(config(stable=1))
    lenient.configure(config(stable=1))  # a new label: allowed with the flag (a restart with labels)
    lenient.models["m"].versions = {1: VersionState(1, State.AVAILABLE), 2: VersionState(2, State.LOADING)}
    with pytest.raises(TrainserveError, match="version 2 of model m"):
        lenient.configure(config(stable=2))  # moving a label: only to an AVAILABLE version, even with the flag
    assert lenient.models["m"].labels == {"stable": 1}, "a refused config changes nothing"
    lenient.models["m"].versions[2].state = State.AVAILABLE
    lenient.configure(config(stable=2, candidate=5))
    assert lenient.models["m"].labels == {"stable": 2, "candidate": 5}


@pytest.mark.unit
def test_serving_image_starts_the_rollout_config_or_waits_for_it(serving_image_box, tmp_path):
    """images/serve-cpu/entrypoint.sh with ROLLOUT_CONFIG_FILE: started from MODEL_NAME where writable (compose),
    never replaced once there, waited for where read-only (Kubernetes); labels allowed at restart."""
    import subprocess

    box, entrypoint, server_flags = serving_image_box, serve_cpu_scripts.entrypoint, serve_cpu_scripts.server_flags
    config = tmp_path / "rollout" / "models.config"
    config.parent.mkdir()
    proc = entrypoint(box, ROLLOUT_CONFIG_FILE=str(config), MODEL_NAME="cats")
    assert proc.returncode == 0, proc.stderr
    flags = server_flags(box)
    assert flags["model_config_file"] == str(config) and flags["allow_version_labels_for_unavailable_models"] == "true"
    assert flags["model_config_file_poll_wait_seconds"] == "10"
    (model,) = parse_model_config(config).model_config_list.config
    assert (model.name, model.base_path, dict(model.version_labels)) == ("cats", "/models/cats", {})
    config.write_text(config.read_text().replace("cats", "dogs"))
    assert entrypoint(box, ROLLOUT_CONFIG_FILE=str(config)).returncode == 0
    assert "dogs" in config.read_text(), "a rollout config is never replaced"

    not_writable = tmp_path / "not-mounted-yet"  # where the config cannot be written (read-only in k8s)
    waiting = subprocess.Popen(
        [serve_cpu_scripts.SERVE_CPU / "entrypoint.sh"],
        env={**box, "ROLLOUT_CONFIG_FILE": str(not_writable / "models.config"), "ROLLOUT_WAIT_SECONDS": "0.2"},
        stderr=subprocess.PIPE,
        text=True,
    )
    # The script says it waits just before its wait loop; it can leave the loop only once the config exists.
    said = next((line for line in iter(waiting.stderr.readline, "") if "waiting for" in line), None)  # None: it ended
    assert said is not None and waiting.poll() is None, "waits for the promote Job's config"
    not_writable.mkdir()
    (not_writable / "models.config").write_text(config.read_text())
    assert waiting.wait(timeout=30) == 0
    assert server_flags(box)["model_config_file"].startswith(str(not_writable))
