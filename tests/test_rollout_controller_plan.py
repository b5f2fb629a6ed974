"""`trainserve rollout` without a Prometheus: the step plan's grammar, each step's verdict from its counts (the
flip rate's bounds against scipy's), the refusals that move nothing, the dry run, an unreachable Prometheus that
holds the rollout and never advances it, --abort, and a resume that is not this rollout's."""

from __future__ import annotations

import argparse
import json
import re
import socket

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from reports import compared_with, eval_report, write

from conftest import REPO
from trainserve.cli import build_parser, main
from trainserve.files import locked
from trainserve.options import config_from_args
from trainserve.proxy.routing import read_routing
from trainserve.rollout.analysis import ADVANCE, FAIL, HOLD, PASS, ROLLBACK, UNKNOWN, WATCH, checks, decide
from trainserve.rollout.config import CandidateConfig, PromoteConfig
from trainserve.rollout.config_file import history_path, read_config
from trainserve.rollout.history import read_history
from trainserve.rollout.labels import Rollout
from trainserve.rollout.measure import KEYS
from trainserve.rollout.plan import CANARY, PROMOTE, SHADOW, Step, parse_plan
from trainserve.rollout.rollout_config import RolloutConfig, StepGate
from trainserve.rollout.steps import promote, stage_candidate

GATE = StepGate(min_requests=100)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "steps"),
    [
        pytest.param(
            "shadow 10m, 5% 10m, 25% 10m, 100%",
            [(SHADOW, 100, 600), (CANARY, 5, 600), (CANARY, 25, 600), (PROMOTE, 100, 0)],
            id="issue",
        ),
        pytest.param("shadow 50% 30s,100%", [(SHADOW, 50, 30), (PROMOTE, 100, 0)], id="shadow-share"),
        pytest.param("1% 0.5s, 100% 1h, 100%", [(CANARY, 1, 0.5), (CANARY, 100, 3600), (PROMOTE, 100, 0)], id="soak"),
    ],
)
def test_a_plan_parses_into_its_steps(text, steps):
    plan = parse_plan(text)
    assert [(s.kind, s.percent, s.seconds) for s in plan.steps] == steps
    assert parse_plan(plan.text()) == plan  # the history's words read back as the same plan


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param("shadow 10m, 5% 10m", "end with `100%`", id="no-promote"),
        pytest.param("100%, 5% 1m, 100%", "and only there", id="promote-first"),
        pytest.param("5% 1m, shadow 1m, 100%", "shadow steps before", id="shadow-late"),
        pytest.param("25% 1m, 5% 1m, 100%", "above the one before", id="falling"),
        pytest.param("5% 10, 100%", "with a unit", id="no-unit"),
        pytest.param("5% 0s, 100%", "above 0", id="zero-time"),
        pytest.param("150% 1m, 100%", "at most 100", id="over-100"),
        pytest.param("0% 1m, 100%", "above 0", id="zero-share"),
        pytest.param("5% 1m,, 100%", "separated by commas", id="empty-step"),
        pytest.param("5 % 1m, 100%", "expected a share in", id="space"),
        pytest.param("100%", "expected a step before", id="promote-only"),
    ],
)
def test_a_malformed_plan_names_what_was_expected(text, fragment):
    with pytest.raises(argparse.ArgumentTypeError, match=fragment.replace("`", ".").replace("%", ".")):
        parse_plan(text)


def counts(**seen: int) -> dict:
    """A step's counts in measure's contract: every key 0 but those given."""
    return dict.fromkeys(KEYS, 0) | seen


OFFLINE = {"disagreement": {"source": "eval", "count": 200, "examples": 10_000, "candidate": 2, "baseline": 1}}
CANARY_STEP, SHADOW_STEP = Step(CANARY, 5, 60), Step(SHADOW, 100, 60)
# A canary step with stable at 1 % errors and 1 % slow calls, and its canary like it.
ALIKE = {"stable_requests": 40_000, "stable_errors": 400, "stable_latency_count": 40_000, "stable_slow": 400}
GOOD = counts(**ALIKE, canary_requests=8000, canary_errors=80, candidate_latency_count=8000, candidate_slow=80)
PAIRS = {"shadow_pairs": 8000, "shadow_classified": 8000, "shadow_compared": 8000}


@pytest.mark.unit
@pytest.mark.parametrize(
    ("step", "flips", "seen", "ended", "decision", "results"),
    [
        pytest.param(CANARY_STEP, False, GOOD, True, ADVANCE, [PASS, PASS], id="good"),
        pytest.param(CANARY_STEP, False, GOOD, False, WATCH, [PASS, PASS], id="good-early"),
        pytest.param(CANARY_STEP, False, counts(**ALIKE), True, HOLD, [UNKNOWN, UNKNOWN], id="no-canary"),
        pytest.param(
            CANARY_STEP,
            False,
            GOOD | {"canary_requests": 99, "canary_errors": 1},
            True,
            HOLD,
            [UNKNOWN, PASS],
            id="few-no-verdict",
        ),
        pytest.param(
            CANARY_STEP, False, GOOD | {"canary_errors": 240}, False, ROLLBACK, [FAIL, PASS], id="errors-3pct"
        ),
        pytest.param(
            CANARY_STEP,
            False,
            GOOD | {"canary_requests": 400, "canary_errors": 8},  # 2 %: 1 point over, not shown either way
            True,
            HOLD,
            [UNKNOWN, PASS],
            id="errors-unclear",
        ),
        pytest.param(
            CANARY_STEP,
            False,
            GOOD | {"canary_requests": 20, "canary_errors": 20},  # rejects everything: certain before 100
            False,
            ROLLBACK,
            [FAIL, PASS],
            id="rejects-all",
        ),
        pytest.param(
            CANARY_STEP,
            False,
            counts(  # 30 % of both versions' requests fail: no rollback
                **ALIKE | {"stable_errors": 12_000},
                canary_requests=2000,
                canary_errors=600,
                candidate_latency_count=2000,
                candidate_slow=20,
            ),
            True,
            HOLD,
            [UNKNOWN, UNKNOWN],
            id="outage-on-both",
        ),
        pytest.param(CANARY_STEP, False, GOOD | {"candidate_slow": 400}, False, ROLLBACK, [PASS, FAIL], id="slow"),
        pytest.param(
            SHADOW_STEP, True, counts(**PAIRS, shadow_flips=240), True, ADVANCE, [PASS, PASS, PASS, PASS], id="flips"
        ),
        pytest.param(
            SHADOW_STEP,
            True,
            counts(**PAIRS, shadow_flips=480),
            False,
            ROLLBACK,
            [PASS, PASS, PASS, FAIL],
            id="flips-6pct",
        ),
        pytest.param(
            SHADOW_STEP,
            True,
            counts(**PAIRS, shadow_flips=320),
            True,
            HOLD,
            [PASS, PASS, PASS, UNKNOWN],
            id="flips-at-budget",
        ),
        pytest.param(
            SHADOW_STEP,
            True,
            counts(shadow_pairs=8000, shadow_compared=8000, shadow_flips=0),
            True,
            HOLD,
            [PASS, PASS, PASS, UNKNOWN],
            id="nothing-classified",
        ),
        pytest.param(
            SHADOW_STEP,
            True,
            counts(**PAIRS, shadow_flips=320, shadow_dropped=1500, shadow_shed=8000),  # 4 %: unclear had all been sent
            False,
            WATCH,
            [PASS, PASS, PASS, UNKNOWN],
            id="copies-dropped",
        ),
        pytest.param(
            SHADOW_STEP,
            True,
            counts(**PAIRS, shadow_flips=2000, shadow_dropped=1500, shadow_shed=8000),  # 25 %: beyond whatever
            False,
            ROLLBACK,
            [PASS, PASS, PASS, FAIL],
            id="copies-dropped-flips-certain",
        ),
        pytest.param(
            SHADOW_STEP,
            False,
            counts(shadow_compared=1000, shadow_errors=40, stable_requests=20_000),
            False,
            ROLLBACK,
            [FAIL, PASS],
            id="shadow-errors",
        ),
        pytest.param(  # 5 % transient errors on every call to the server, copies included: stable's share too
            SHADOW_STEP,
            False,
            counts(shadow_compared=95_000, shadow_errors=5000, stable_requests=100_000, stable_errors=5000),
            True,
            ADVANCE,
            [PASS, PASS],
            id="shadow-errors-transient-5pct",
        ),
        pytest.param(  # 1 % transient: not a hold either
            SHADOW_STEP,
            False,
            counts(shadow_compared=19_800, shadow_errors=200, stable_requests=20_000, stable_errors=200),
            True,
            ADVANCE,
            [PASS, PASS],
            id="shadow-errors-transient-1pct",
        ),
        pytest.param(  # 5 % transient and 5 % of its own: beyond stable's share by more than the budget
            SHADOW_STEP,
            False,
            counts(shadow_compared=18_000, shadow_errors=2000, stable_requests=20_000, stable_errors=1000),
            False,
            ROLLBACK,
            [FAIL, PASS],
            id="shadow-errors-own-over-transient",
        ),
    ],
)
def test_a_step_is_judged_on_its_counts(step, flips, seen, ended, decision, results):
    found = checks(step, flips, seen, GATE, OFFLINE)
    assert [c.result for c in found] == results, [c.said for c in found]
    assert decide(found, ended) == decision


# -- the command -----------------------------------------------------------------------------------------------


class AppliedServer:
    def wait_available(self, model, version, wait):
        pass

    def wait_label(self, model, label, version, wait):
        pass


@pytest.fixture
def site(tmp_path):
    """Model m: version 1 stable, version 2 the candidate with a passing report; returns (config, report)."""
    base = tmp_path / "models" / "m"
    config = tmp_path / "rollout" / "models.config"
    config.parent.mkdir()
    for version in (1, 2):
        (base / str(version)).mkdir(parents=True)
        (base / str(version) / "saved_model.pb").write_bytes(b"graph %d" % version)
        stage_candidate(CandidateConfig(config, "m", str(base), version, "unused:1", 1), AppliedServer())
        report = compared_with(eval_report(base / str(version)), None if version == 1 else 1)
        path = write(report, tmp_path / f"report-{version}.json")
        if version == 1:
            promote(PromoteConfig(config, path))
    return config, path


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # closed once the socket is: connections are refused


def args(config, report, *more) -> list[str]:
    return [
        "rollout",
        *("--config", str(config), "--candidate", "2", "--report", str(report)),
        *("--routing-file", str(config.parent / "routing.json"), "--plan", "shadow 1s, 5% 1s, 100%"),
        *more,
    ]


def snapshot(config):
    routing = config.parent / "routing.json"
    return config.read_bytes(), history_path(config).read_bytes(), routing.exists() and routing.read_bytes()


def exit_code(argv: list[str]) -> int:
    """main's exit status, whether the parser refused (argparse exits) or the command did."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def last_error(capsys) -> str:
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.unit
def test_an_unreachable_prometheus_holds_the_rollout_and_never_advances_it(site, capsys):
    config, report = site
    code = main(args(config, report, "--prometheus", closed_port_url(), "--interval", "0.05", "--max-hold", "0.2"))
    assert code == 75
    line = last_error(capsys)
    assert "paused at step 1 (shadow 100% 1s)" in line and "cannot be reached" in line, line
    route = read_routing(config.parent / "routing.json").route("m")  # no step entered without its counts' origin:
    assert (route.shadow_percent, route.canary_percent) == (0, 0)  # routed with no share (version-less on stable)
    events = [e["event"] for e in read_history(history_path(config)) if e.get("action") == "rollout"]
    assert events == ["start", "paused"]
    assert Rollout.of(read_config(config).model_config_list.config[0]) == Rollout(stable=1, candidate=2)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        pytest.param(lambda r: r.update(version=1), "expected model m version 2", id="other-version"),
        pytest.param(lambda r: r["evidence"].update(kind="unverified"), "its evidence is unverified", id="evidence"),
        pytest.param(
            lambda r: (r["evidence"].update(partial=True), r["settings"].update(limit=5)), "--limit 5", id="partial"
        ),
    ],
)
def test_evidence_promote_would_refuse_starts_nothing(site, capsys, edit, fragment):
    config, report = site
    document = json.loads(report.read_text())
    edit(document)
    report.write_text(json.dumps(document))
    before = snapshot(config)
    assert main(args(config, report, "--prometheus", closed_port_url())) == 2
    line = last_error(capsys)
    assert fragment in line and line.startswith("trainserve rollout: error:"), line
    assert snapshot(config) == before


@pytest.mark.unit
@pytest.mark.parametrize(
    ("more", "fragment"),
    [
        pytest.param([], "expected --prometheus URL", id="no-prometheus"),
        pytest.param(["--prometheus", "prometheus:9090"], "expected an http(s) URL", id="bad-url"),
        pytest.param(["--prometheus", "http://p:9090", "--plan", "5% 1m"], "end with `100%`", id="bad-plan"),
        pytest.param(
            ["--prometheus", "http://p:9090", "--gate-flip-budget-multiple", "0.5"], "multiple >= 1", id="multiple"
        ),
        pytest.param(["--abort"], "--abort: expected --reason TEXT", id="abort-reason"),
        pytest.param(["--abort", "--reason", "x"], "no rollout of model m is in progress", id="abort-none"),
    ],
)
def test_bad_input_is_one_line_and_moves_nothing(site, capsys, more, fragment):
    config, report = site
    before = snapshot(config)
    assert exit_code(args(config, report, *more)) == 2
    assert fragment in last_error(capsys)
    assert snapshot(config) == before


@pytest.mark.unit
def test_a_second_controller_of_the_model_is_refused_at_once_and_moves_nothing(site, capsys):
    config, report = site
    before = snapshot(config)
    with locked(config, "rollout-m.lock", "the first controller"):  # the lock a running controller holds
        assert exit_code(args(config, report, "--prometheus", closed_port_url())) == 2
    line = last_error(capsys)
    assert "another `trainserve rollout` of model m holds" in line and ".models.config.rollout-m.lock" in line, line
    assert snapshot(config) == before


@pytest.mark.unit
def test_the_dry_run_prints_the_plan_and_the_queries_and_changes_nothing(site, capsys):
    config, report = site
    before = snapshot(config)
    assert main(args(config, report, "--dry-run")) == 0
    out = capsys.readouterr().out
    assert "evidence: " in out and "holds every check promote makes" in out
    shadow_checks = "checks shadow_errors, slow_copies, flip_classes, flip_rate"
    assert f"step 1: shadow 100% 1s: shadow 100%, canary 0%; {shadow_checks}" in out
    assert "step 2: 5% 1s: shadow 100%, canary 5%; checks error_ratio, slow_calls, flip_classes, flip_rate" in out
    assert "step 3: 100%: promote (stable -> 2), routing cleared" in out
    assert 'canary_errors: sum by (instance) (:trainserve:proxy:request_count{job="proxy",model_name="m",' in out
    assert snapshot(config) == before


@pytest.mark.integration
def test_the_dry_run_of_plan_auto_says_what_it_would_take_or_why_it_would_not_start(site, capsys):
    """Sized at --expected-rate as the controller sizes it at the start; at 1 request/s no plan decides within
    --max-duration, and the dry run says so with what would."""
    config, report = site
    before = snapshot(config)
    assert main(args(config, report, "--dry-run", "--plan", "auto", "--expected-rate", "10")) == 0
    out = capsys.readouterr().out
    plan = re.search(r"plan auto: (shadow 100% \d+s hold \d+s, (25|50)% (\d+)s hold \d+s, 100%)\n", out)
    assert plan, out
    share, seconds = plan[2], plan[3]  # 50 %: the shadow step's wait for a one-class flipper left 25 % over target
    assert "at 10 requests/s (--expected-rate), stable's error share 0.00%" in out
    assert re.search(r"promoted in about \d+m \(90 %: \d+m\); at most (1h )?\d+m before a step would pause", out)
    step = next(line for line in out.splitlines() if line.startswith(f"  step 2: {share}% {seconds}s"))
    exposure = f"exposure: about {int(share) * 3} canary requests"  # 10 requests/s, looked at every 30 s
    assert "canary requests by its duration" in step and exposure in step
    assert float(re.search(r"pauses in ([\d.]+)% of runs", step)[1]) <= 2
    assert f"step 2: {share}% {seconds}s hold" in out and f"canary {share}%; checks error_ratio, slow_calls" in out
    assert (
        main(args(config, report, "--dry-run", "--plan", "auto", "--expected-rate", "10", "--approve-before", "canary"))
        == 0
    )
    assert f"approval: before step 2 ({share}% {seconds}s hold" in capsys.readouterr().out
    assert (
        main(args(config, report, "--dry-run", "--plan", "auto", "--expected-rate", "1", "--max-duration", "4h")) == 0
    )
    out = capsys.readouterr().out
    assert "plan auto: REFUSED: no plan decides within --max-duration 4h 0m at 1 requests/s" in out
    assert snapshot(config) == before


@pytest.mark.unit
def test_abort_and_a_resume_that_is_not_this_rollouts(site, capsys):
    config, report = site
    url = closed_port_url()
    assert main(args(config, report, "--prometheus", url, "--interval", "0.05", "--max-hold", "0.1")) == 75
    capsys.readouterr()
    assert main(args(config, report, "--prometheus", url, "--plan", "shadow 2s, 100%")) == 2
    assert "expected the same --plan (or `auto`) to resume it" in last_error(capsys)
    assert main(args(config, report, "--abort", "--reason", "pager at 3am")) == 1
    assert capsys.readouterr().out.startswith("rolled back: model m version 2: aborted: pager at 3am; stable -> 1")
    assert Rollout.of(read_config(config).model_config_list.config[0]) == Rollout(stable=1)
    assert read_routing(config.parent / "routing.json").route("m") is None
    events = [e["event"] for e in read_history(history_path(config)) if e.get("action") == "rollout"]
    assert events == ["start", "paused", "rollback", "rolled-back"]


@pytest.mark.unit
def test_the_one_file_of_thresholds_sets_the_commands_flags_for_compose_and_kubernetes(monkeypatch):
    env_file = REPO / "k8s" / "components" / "progressive-delivery" / "rollout.env"
    pairs = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if line and line[0] != "#")
    for name, value in pairs.items():
        monkeypatch.setenv(name, value)
    args = build_parser().parse_args(["rollout"])
    assert all(hasattr(args, name.removeprefix("TRAINSERVE_").lower()) for name in pairs), sorted(pairs)
    config = config_from_args(RolloutConfig, args)
    assert config.plan == "auto"
    limits = (config.target_duration, config.max_duration, config.max_exposure, config.rate_history)
    assert limits == (RolloutConfig.target_duration, RolloutConfig.max_duration, RolloutConfig.max_exposure, "7d")
    assert config.gate == StepGate()  # the file states every default, so a changed default changes the file too
    compose = yaml.safe_load((REPO / "compose.yaml").read_text())["services"]["rollout"]
    assert compose["env_file"] == [str(env_file.relative_to(REPO))] and compose["command"][0] == "rollout"
    kustomization = yaml.safe_load((env_file.parent / "kustomization.yaml").read_text())
    assert kustomization["configMapGenerator"][0]["envs"] == [env_file.name]


@st.composite
def plans(draw) -> str:
    """Any valid plan, in a person's words: shadow steps, rising canary shares (each with or without its hold),
    `100%`."""
    duration = st.builds(lambda n, unit: f"{n}{unit}", st.integers(1, 90), st.sampled_from("smh"))
    shadows = draw(st.lists(st.tuples(st.integers(1, 100), duration), max_size=2))
    shares = sorted(set(draw(st.lists(st.integers(1, 100), min_size=0 if shadows else 1, max_size=4))))
    held = st.one_of(st.just(""), duration.map(lambda d: f" hold {d}"))
    words = [f"shadow {p}% {d}{draw(held)}" for p, d in shadows]
    words += [f"{p}% {draw(duration)}{draw(held)}" for p in shares] + ["100%"]
    return ", ".join(words)


@pytest.mark.unit
@settings(max_examples=100, deadline=None)
@given(plans())
def test_every_valid_plan_reads_back_from_its_canonical_words(text):
    plan = parse_plan(text)
    assert parse_plan(plan.text()) == plan
    assert plan.steps[-1].kind == PROMOTE and len(plan.steps) == text.count(",") + 1
    for i, step in enumerate(plan.steps[:-1]):  # the routing of each step: the share its words give
        assert plan.canary_during(i) == (step.percent if step.kind == CANARY else 0)
        assert plan.shadow_during(i) == max([0] + [s.percent for s in plan.steps[: i + 1] if s.kind == SHADOW][-1:])


@pytest.mark.unit
def test_the_rollout_help_says_what_its_checks_compare(capsys):
    """`rollout --help` describes the checks that run (analysis.py), not the p99 comparison they replaced."""
    with pytest.raises(SystemExit):
        main(["rollout", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "p99 latency against stable's" not in text
    for said in ("error share", "slower than stable's p99", "failed copies against stable's error share", "flip rate"):
        assert said in text, said
