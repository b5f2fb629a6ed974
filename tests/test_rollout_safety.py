"""A rollout's safe moves, on the real controller in process with Prometheus played by a stand-in that answers as it
would for two proxy replicas, one of which reads the routing file late: nothing unjudged reaches a client (the label
commands refuse during a rollout, a rewritten report is not promoted, labels moved by hand roll back, a failure
holds the route on stable) and a rollback drops the `candidate` label only once every replica left the canary.
(With the real proxy, serve-local and Prometheus: test_rollout_safety_live.py.)"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from reports import compared_with, eval_report, write

from trainserve.cli import main
from trainserve.evidence.document import read_report
from trainserve.proxy.routing import ModelRoute, read_routing, write_routing
from trainserve.proxy.routing import Routing as RoutingFile
from trainserve.rollout.config import CandidateConfig, PromoteConfig
from trainserve.rollout.config_file import history_path, read_config, write_config
from trainserve.rollout.controller import Controller
from trainserve.rollout.ends import RollbackPending
from trainserve.rollout.history import append_history, read_history
from trainserve.rollout.labels import Rollout, apply_rollout
from trainserve.rollout.plan import parse_plan
from trainserve.rollout.progress import PROMOTE, ROLLBACK, START, STEP, event
from trainserve.rollout.rollout_config import RolloutConfig
from trainserve.rollout.steps import promote, stage_candidate

pytestmark = pytest.mark.unit

PLAN = "shadow 1s, 25% 1s, 100%"  # step 1 (index 1) gives the candidate 25 %


class Applied:
    """A server that has applied every change; records what the config and routing said when asked to unload."""

    def __init__(self, config: Path | None = None):
        self.config, self.unloads = config, []

    def wait_available(self, model, version, wait):
        pass

    def wait_label(self, model, label, version, wait):
        pass

    def wait_unloaded(self, model, version, wait):
        now = route(self.config)
        self.unloads.append(
            (labels(self.config).candidate, now and (now.candidate, now.shadow_percent, now.canary_percent))
        )


def labels(config: Path) -> Rollout:
    return Rollout.of(read_config(config).model_config_list.config[0])


def route(config: Path) -> ModelRoute | None:
    return read_routing(config.parent / "routing.json").route("m")


def rollout_events(config: Path) -> list[dict]:
    return [e for e in read_history(history_path(config)) if e.get("action") == "rollout"]


@pytest.fixture
def site(tmp_path) -> tuple[Path, Path]:
    return site_in(tmp_path)


def site_in(tmp_path: Path) -> tuple[Path, Path]:
    """Model m: version 1 stable, version 2 the candidate with a passing report; returns (config, report)."""
    base, config = tmp_path / "models" / "m", tmp_path / "rollout" / "models.config"
    config.parent.mkdir()
    for version in (1, 2):
        (base / str(version)).mkdir(parents=True)
        (base / str(version) / "saved_model.pb").write_bytes(b"graph %d" % version)
        stage_candidate(CandidateConfig(config, "m", str(base), version, "unused:1", 1), Applied())
        report = write(
            compared_with(eval_report(base / str(version)), None if version == 1 else 1), tmp_path / "r.json"
        )
        if version == 1:
            promote(PromoteConfig(config, report))
    return config, report


def begun(config: Path, report: Path, *moves: tuple[str, dict], canary: float = 25) -> dict:
    """The history a controller killed mid-rollout of version 2 leaves (its START, then `moves`), and the routing file
    as it left it: 25 % to the candidate."""
    start = append_history(
        history_path(config),
        event(
            START,
            "m",
            2,
            plan=parse_plan(PLAN).text(),
            stable=1,
            flips=True,
            report=str(report),
            report_sha256=read_report(report).sha256,
            offline={},
            routing_file=str(config.parent / "routing.json"),
            sticky_header=None,
            sticky_salt="m:2",
        ),
    )
    for kind, fields in moves:
        append_history(history_path(config), event(kind, "m", 2, **fields))
    write_routing(config.parent / "routing.json", RoutingFile({"m": ModelRoute(2, 100, canary)}))
    return start


CANARY_STEP = (STEP, {"step": 1, "words": "25% 1s", "started": 0.0, "counters": {}})


class Replicas:
    """Prometheus as it sees two proxy replicas, `a` and `b`, each scraped at every ask: `a` follows the routing
    file at once, `b` keeps reporting the canary share it had for its first `lag` asks. Each ask of the gauges records
    (b's share, the `candidate` label then)."""

    def __init__(self, config: Path, lag: int, fail: Exception | None = None, on_ask=None):
        self.config, self.lag, self.fail, self.on_ask = config, lag, fail, on_ask
        self.clock, self.asks, self.seen = 1000.0, 0, []
        self.stale = route(config).canary_percent

    def value(self, expr: str) -> float | None:
        self.asked()
        return self.clock if expr == "vector(time())" else None

    def asked(self) -> None:
        if self.on_ask is not None:
            self.on_ask()
        if self.fail is not None:
            raise self.fail

    def series(self, expr: str) -> list[tuple[dict, float]]:
        self.clock += 1
        if expr.startswith("up"):
            return [({"instance": i}, 1.0) for i in "ab"]
        if expr.startswith("timestamp(up"):
            return [({"instance": i}, self.clock) for i in "ab"]
        if expr != ':trainserve:proxy:canary_percent{job="proxy",model_name="m"}':
            self.asked()
            return []  # a step's counters: no data yet (the step holds)
        self.asks += 1
        now = route(self.config)
        b = self.stale if self.asks <= self.lag else (now.canary_percent if now else None)
        self.seen.append((b, labels(self.config).candidate))
        a = [({"instance": "a", "version": "2"}, now.canary_percent)] if now else []
        return a + ([({"instance": "b", "version": "2"}, b)] if b is not None else [])


def controller(config: Path, report: Path, prometheus, server=None, **more) -> Controller:
    """The real controller, with a clock that moves only when it sleeps."""
    settings = {"interval": 1.0, "wait": 30.0, "max_hold": 5.0, "bake": 0.0, **more}
    rollout = RolloutConfig(
        config=config, routing_file=config.parent / "routing.json", report=report, plan=PLAN, **settings
    )
    rollout.prometheus = "http://prometheus.invalid:9090"
    now = [0.0]
    return Controller(rollout, prometheus, server, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))


@pytest.mark.parametrize("argv", [["candidate", "--version", "2"], ["promote", "--report", "R"], ["rollback"]])
def test_the_label_commands_refuse_while_a_rollout_of_the_model_is_in_progress(site, capsys, argv):
    config, report = site
    begun(config, report, CANARY_STEP)
    before = config.read_bytes(), history_path(config).read_bytes()
    argv = [a if a != "R" else str(report) for a in argv]
    assert main([*argv, "--config", str(config), "--server", "unused:1", "--wait", "0"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{argv[0]} refused: a rollout of model m version 2 is in progress" in line, line
    assert (config.read_bytes(), history_path(config).read_bytes()) == before


def test_a_retried_jobs_candidate_step_stages_nothing_during_the_rollout(site, capsys):
    config, report = site
    (Path(read_config(config).model_config_list.config[0].base_path) / "3").mkdir()  # published mid-rollout
    begun(config, report, CANARY_STEP)
    before = config.read_bytes()
    argv = ["candidate", "--config", str(config), "--server", "unused:1", "--skip-during-rollout"]
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith("candidate: nothing staged: candidate refused: a rollout of model m")
    assert config.read_bytes() == before and labels(config) == Rollout(stable=1, candidate=2)


def test_a_retried_jobs_eval_step_evaluates_nothing_during_the_rollout(site, caplog):
    """In the bake no `candidate` is labelled: the Job's eval, retried, must not fail the Job before the controller
    resumes (and in the steps its report would go unused: the rollout resumes on the report it began on)."""
    config, report = site
    begun(config, report, CANARY_STEP)
    argv = ["eval", "--server", "unused:1", "--model", "m", "--label", "candidate", "--compare-with", "stable"]
    caplog.set_level(logging.INFO, logger="trainserve.evaluation")
    assert main([*argv, "--rollout-config", str(config), "--skip-during-rollout"]) == 0
    assert "nothing evaluated (--skip-during-rollout): eval refused: a rollout of model m version 2" in caplog.text


def test_skip_during_rollout_without_the_config_whose_history_says_so_is_refused_in_one_line(capsys):
    assert main(["eval", "--server", "unused:1", "--model", "m", "--skip-during-rollout"]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .endswith("--skip-during-rollout: expected --rollout-config FILE (whose history says so)")
    )


def test_a_rollback_drops_the_label_only_once_every_replica_left_the_canary(site):
    config, report = site
    begun(config, report, CANARY_STEP, (ROLLBACK, {"step": 1, "said": "error_ratio: too many"}))
    replicas, server = Replicas(config, lag=3), Applied(config)
    outcome = controller(config, report, replicas, server).run()
    assert not outcome.promoted and outcome.said.startswith("model m version 2: error_ratio: too many; stable -> 1")
    assert [b for b, _ in replicas.seen] == [25, 25, 25, 0]  # b read late; the controller waited for it
    assert all(candidate == 2 for b, candidate in replicas.seen)  # the label kept while any replica had a share
    assert labels(config) == Rollout(stable=1)
    # the route, held with no share, kept until the server no longer served the version; then removed
    assert server.unloads == [(None, (2, 0, 0))] and route(config) is None
    assert [e["event"] for e in rollout_events(config)][-2:] == ["rollback", "rolled-back"]


def test_an_abort_that_cannot_confirm_is_pending_and_a_rerun_finishes_it(site, capsys):
    config, report = site
    begun(config, report, CANARY_STEP)
    never = Replicas(config, lag=10**6)
    with pytest.raises(RollbackPending, match="not every proxy replica reports it within --wait 5 s"):
        controller(config, report, never, Applied(config), abort=True, reason="pager", wait=5.0).run()
    assert labels(config) == Rollout(stable=1, candidate=2)  # kept: b may still send requests to version 2
    assert (route(config).canary_percent, route(config).shadow_percent) == (0, 0)
    assert [e["event"] for e in rollout_events(config)] == ["start", "step", "rollback"]
    outcome = controller(config, report, Replicas(config, lag=0), Applied(config)).run()  # the rerun
    assert outcome.said.startswith("model m version 2: aborted: pager; stable -> 1")
    assert labels(config) == Rollout(stable=1) and route(config) is None
    assert [e["event"] for e in rollout_events(config)] == ["start", "step", "rollback", "rolled-back"]


def test_a_report_rewritten_since_the_start_is_not_promoted(site):
    """A retried Job's eval overwrote the report the rollout began on: promotion refuses it and rolls back."""
    config, report = site
    begun(config, report, CANARY_STEP, (PROMOTE, {"step": 2}))
    document = json.loads(report.read_text())
    report.write_text(json.dumps(document | {"created": "2026-11-27T09:00:00Z"}))  # the same version, other bytes
    outcome = controller(config, report, Replicas(config, lag=0), Applied(config)).run()
    assert not outcome.promoted and "not promoted: the report" in outcome.said and "SHA-256" in outcome.said
    assert labels(config) == Rollout(stable=1) and route(config) is None
    last = rollout_events(config)[-1]
    assert last["event"] == "rolled-back" and "rewritten since" in last["said"]


def test_labels_moved_by_hand_during_a_step_roll_it_back(site):
    config, report = site
    begun(config, report, CANARY_STEP)

    def stage_by_hand():  # at the first look, someone labels another version `candidate` (a hand edit)
        served = read_config(config)
        apply_rollout(served.model_config_list.config[0], Rollout(stable=1, candidate=3))
        write_config(config, served)

    server = Applied(config)
    outcome = controller(config, report, Replicas(config, lag=0, on_ask=stage_by_hand), server).run()
    assert not outcome.promoted and "`candidate` names version 3, not version 2: moved under" in outcome.said
    assert route(config) is None and rollout_events(config)[-1]["event"] == "rolled-back"
    assert server.unloads == [(3, (2, 0, 0))]  # version 2 gone before the route that kept it off went


def test_a_failure_after_the_routing_is_written_leaves_no_canary_share(site):
    config, report = site
    begun(config, report, CANARY_STEP)
    with pytest.raises(RuntimeError, match="disk gone"):  # at the resumed step's first look
        controller(config, report, Replicas(config, lag=0, fail=RuntimeError("disk gone"))).run()
    assert (route(config).canary_percent, route(config).shadow_percent) == (0, 0)


def test_a_terminated_controller_holds_the_route_on_stable_before_it_exits(site):
    """SIGTERM (a pod deleted) at a resumed 25 % step: the controller exits 143 with no canary share left."""
    config, report = site
    begun(config, report, CANARY_STEP, canary=0)

    def terminate_at_the_canary_step():
        while (route(config) or ModelRoute(2)).canary_percent != 25:
            time.sleep(0.01)  # polls the routing file: the controller's own write is the event
        os.kill(os.getpid(), signal.SIGTERM)

    killer = threading.Thread(target=terminate_at_the_canary_step, daemon=True)
    killer.start()
    argv = [
        *("rollout", "--config", str(config), "--report", str(report), "--plan", PLAN, "--interval", "0.05"),
        *("--routing-file", str(config.parent / "routing.json"), "--prometheus", "http://127.0.0.1:9"),
    ]
    with pytest.raises(SystemExit) as exited:
        main(argv)
    killer.join(timeout=30)
    assert exited.value.code == 128 + signal.SIGTERM
    assert (route(config).canary_percent, route(config).shadow_percent) == (0, 0)
