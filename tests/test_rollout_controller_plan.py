"""`trainserve rollout` without a Prometheus: the step plan's grammar, each step's verdict from its counts (the
flip rate's bounds against scipy's), the refusals that move nothing, the dry run, an unreachable Prometheus that
holds the rollout and never advances it, --abort, and a resume that is not this rollout's."""

from __future__ import annotations

import argparse
import json
import socket

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from reports import compared_with, eval_report, write
from scipy.stats import beta

from conftest import REPO
from prometheus_server import RECORDS
from trainserve.capture.routing import read_routing
from trainserve.cli import build_parser, main
from trainserve.options import config_from_args
from trainserve.rollout.analysis import ADVANCE, FAIL, HOLD, PASS, ROLLBACK, UNKNOWN, WATCH, checks, decide
from trainserve.rollout.config import CandidateConfig, PromoteConfig, RolloutConfig, StepGate
from trainserve.rollout.config_file import history_path, locked, read_config
from trainserve.rollout.history import read_history
from trainserve.rollout.labels import Rollout
from trainserve.rollout.measure import NOT_SERVER_ERRORS, queries, step_counts
from trainserve.rollout.plan import CANARY, PROMOTE, SHADOW, Step, parse_plan
from trainserve.rollout.steps import promote, stage_candidate
from trainserve.stats.proportions import wilson_upper

pytestmark = pytest.mark.unit

GATE = StepGate(max_error_increase=0.01, max_latency_ratio=1.5, max_flip_rate=0.02, min_requests=100, alpha=0.05)


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


def test_the_flip_bounds_are_the_wilson_bounds_and_close_to_the_exact_ones():
    # the two-sided Clopper-Pearson interval at 2 alpha brackets the one-sided Wilson bounds' neighbourhood
    for flips, pairs in [(0, 200), (3, 200), (40, 200), (10, 5000)]:
        upper = wilson_upper(flips, pairs, 0.05)
        exact_upper = beta.ppf(0.95, flips + 1, pairs - flips) if flips < pairs else 1.0
        assert abs(upper - exact_upper) < 0.01, (flips, pairs)
        found = checks(Step(SHADOW, 100, 60), True, counts(pairs=pairs, flips=flips, compared=pairs), RATIOS, GATE, {})
        flip = next(c for c in found if c.name == "flip_rate")
        assert f"{upper:.4f}]" in flip.said


def counts(requests=0, pairs=0, flips=0, compared=0, errors=0, failed=0) -> dict:
    return {
        "candidate_requests": requests,
        "candidate_errors": failed,
        "shadow_pairs": pairs,
        "shadow_flips": flips,
        "shadow_compared": compared,
        "shadow_errors": errors,
        "shadow_dropped": 0,
    }


RATIOS = {
    "candidate_error_ratio": 0.0,
    "stable_error_ratio": 0.001,
    "candidate_p99_seconds": 0.010,
    "stable_p99_seconds": 0.010,
}
CANARY_STEP, SHADOW_STEP = Step(CANARY, 5, 60), Step(SHADOW, 100, 60)


@pytest.mark.parametrize(
    ("step", "flips", "seen", "values", "ended", "decision", "results"),
    [
        pytest.param(CANARY_STEP, False, counts(requests=500), RATIOS, True, ADVANCE, [PASS, PASS], id="good"),
        pytest.param(CANARY_STEP, False, counts(requests=500), RATIOS, False, WATCH, [PASS, PASS], id="good-early"),
        pytest.param(CANARY_STEP, False, counts(requests=99), RATIOS, True, HOLD, [UNKNOWN, UNKNOWN], id="few"),
        pytest.param(
            CANARY_STEP,
            False,
            counts(requests=500, failed=6),  # 0.012, stable 0.001
            RATIOS,
            False,
            ROLLBACK,
            [FAIL, PASS],
            id="errors-at-once",
        ),
        pytest.param(
            CANARY_STEP,
            False,
            counts(requests=500, failed=5),  # 0.010, stable 0.001
            RATIOS,
            True,
            ADVANCE,
            [PASS, PASS],
            id="errors-within",
        ),
        pytest.param(
            CANARY_STEP,
            False,
            counts(requests=500),
            {**RATIOS, "candidate_p99_seconds": 0.016},
            True,
            ROLLBACK,
            [PASS, FAIL],
            id="slow",
        ),
        pytest.param(
            CANARY_STEP,
            False,
            counts(requests=500),
            {**RATIOS, "stable_error_ratio": None},
            True,
            HOLD,
            [UNKNOWN, PASS],
            id="no-ratio",
        ),
        pytest.param(
            SHADOW_STEP, True, counts(pairs=800, compared=100), RATIOS, True, ADVANCE, [PASS, PASS], id="shadow"
        ),
        pytest.param(
            SHADOW_STEP,
            True,
            counts(pairs=800, flips=24, compared=100),
            RATIOS,
            True,
            ROLLBACK,
            [PASS, FAIL],
            id="flips",
        ),
        pytest.param(
            SHADOW_STEP,
            True,
            counts(pairs=800, flips=18, compared=100),
            RATIOS,
            False,
            WATCH,
            [PASS, UNKNOWN],
            id="flips-early",
        ),
        pytest.param(
            SHADOW_STEP,
            True,
            counts(pairs=150, flips=3, compared=150),  # 0.02 seen: bounds [0.007, 0.046] straddle 0.02
            RATIOS,
            True,
            HOLD,
            [PASS, UNKNOWN],
            id="flips-inconclusive",
        ),
        pytest.param(
            SHADOW_STEP,
            True,
            counts(pairs=50, flips=20, compared=7),
            RATIOS,
            False,
            ROLLBACK,
            [UNKNOWN, FAIL],
            id="flips-sure",
        ),
        pytest.param(
            SHADOW_STEP,
            False,
            counts(pairs=800, compared=95, errors=5),
            RATIOS,
            True,
            ROLLBACK,
            [FAIL],
            id="shadow-errors",
        ),
    ],
)
def test_a_step_is_judged_on_its_counts(step, flips, seen, values, ended, decision, results):
    found = checks(step, flips, seen, values, GATE, {})
    assert [c.result for c in found] == results, [c.said for c in found]
    assert decide(found, ended) == decision


def test_a_steps_counts_start_from_its_own_start():
    start = {"candidate_requests": 1000.0, "shadow_pairs": 400.0}
    now = {"candidate_requests": 1250.0, "shadow_pairs": 400.0, "shadow_flips": None}
    assert step_counts(now, start) == counts(requests=250)


def test_the_server_errors_counted_are_the_recording_rules():
    rule = RECORDS["trainserve:proxy_errors:ratio_rate5m"]
    assert f'status!~"{NOT_SERVER_ERRORS}"' in rule, rule


def test_the_queries_name_the_contracts_series_and_rules():
    found = queries("m", 7, 3)
    assert found["candidate_error_ratio"] == 'max(trainserve:proxy_errors:ratio_rate5m{model_name="m",version="7"})'
    assert found["stable_p99_seconds"] == 'max(trainserve:proxy_latency_seconds:p99_rate5m{model_name="m",version="3"})'
    assert found["candidate_errors"] == (
        ':trainserve:proxy:request_count{model_name="m",version="7",route="canary",status!~"OK|INVALID_ARGUMENT|'
        'NOT_FOUND|CANCELLED"}'
    ).join(["sum(", ")"])
    assert found["shadow_flips"] == 'sum(:trainserve:proxy:shadow_flips{model_name="m",version="7"})'


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


@pytest.mark.parametrize(
    ("more", "fragment"),
    [
        pytest.param([], "expected --prometheus URL", id="no-prometheus"),
        pytest.param(["--prometheus", "prometheus:9090"], "expected an http(s) URL", id="bad-url"),
        pytest.param(["--prometheus", "http://p:9090", "--plan", "5% 1m"], "end with `100%`", id="bad-plan"),
        pytest.param(["--prometheus", "http://p:9090", "--gate-max-latency-ratio", "0.5"], "ratio >= 1", id="ratio"),
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


def test_a_second_controller_of_the_model_is_refused_at_once_and_moves_nothing(site, capsys):
    config, report = site
    before = snapshot(config)
    with locked(config, "rollout-m.lock", "the first controller"):  # the lock a running controller holds
        assert exit_code(args(config, report, "--prometheus", closed_port_url())) == 2
    line = last_error(capsys)
    assert "another `trainserve rollout` of model m holds" in line and ".models.config.rollout-m.lock" in line, line
    assert snapshot(config) == before


def test_the_dry_run_prints_the_plan_and_the_queries_and_changes_nothing(site, capsys):
    config, report = site
    before = snapshot(config)
    assert main(args(config, report, "--dry-run")) == 0
    out = capsys.readouterr().out
    assert "evidence: " in out and "holds every check promote makes" in out
    assert "step 1: shadow 100% 1s: shadow 100%, canary 0%; checks shadow_errors, flip_rate" in out
    assert "step 2: 5% 1s: shadow 100%, canary 5%; checks error_ratio, latency_p99, flip_rate" in out
    assert "step 3: 100%: promote (stable -> 2), routing cleared" in out
    assert 'candidate_error_ratio: max(trainserve:proxy_errors:ratio_rate5m{model_name="m",version="2"})' in out
    assert snapshot(config) == before


def test_abort_and_a_resume_that_is_not_this_rollouts(site, capsys):
    config, report = site
    url = closed_port_url()
    assert main(args(config, report, "--prometheus", url, "--interval", "0.05", "--max-hold", "0.1")) == 75
    capsys.readouterr()
    assert main(args(config, report, "--prometheus", url, "--plan", "shadow 2s, 100%")) == 2
    assert "expected the same --plan to resume it" in last_error(capsys)
    assert main(args(config, report, "--abort", "--reason", "pager at 3am")) == 1
    assert capsys.readouterr().out.startswith("rolled back: model m version 2: aborted: pager at 3am; stable -> 1")
    assert Rollout.of(read_config(config).model_config_list.config[0]) == Rollout(stable=1)
    assert read_routing(config.parent / "routing.json").route("m") is None
    events = [e["event"] for e in read_history(history_path(config)) if e.get("action") == "rollout"]
    assert events == ["start", "paused", "rollback", "rolled-back"]


def test_the_one_file_of_thresholds_sets_the_commands_flags_for_compose_and_kubernetes(monkeypatch):
    env_file = REPO / "k8s" / "components" / "progressive-delivery" / "rollout.env"
    pairs = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if line and line[0] != "#")
    for name, value in pairs.items():
        monkeypatch.setenv(name, value)
    args = build_parser().parse_args(["rollout"])
    assert all(hasattr(args, name.removeprefix("TRAINSERVE_").lower()) for name in pairs), sorted(pairs)
    config = config_from_args(RolloutConfig, args)
    assert config.plan.text() == "shadow 100% 600s, 5% 600s, 25% 600s, 100%"
    assert (config.gate.max_flip_rate, config.gate.min_requests) == (0.02, 200)
    compose = yaml.safe_load((REPO / "compose.yaml").read_text())["services"]["rollout"]
    assert compose["env_file"] == [str(env_file.relative_to(REPO))] and compose["command"][0] == "rollout"
    kustomization = yaml.safe_load((env_file.parent / "kustomization.yaml").read_text())
    assert kustomization["configMapGenerator"][0]["envs"] == [env_file.name]


@st.composite
def plans(draw) -> str:
    """Any valid plan, in a person's words: shadow steps, rising canary shares, `100%`."""
    duration = st.builds(lambda n, unit: f"{n}{unit}", st.integers(1, 90), st.sampled_from("smh"))
    shadows = draw(st.lists(st.tuples(st.integers(1, 100), duration), max_size=2))
    shares = sorted(set(draw(st.lists(st.integers(1, 100), min_size=0 if shadows else 1, max_size=4))))
    words = [f"shadow {p}% {d}" for p, d in shadows] + [f"{p}% {draw(duration)}" for p in shares] + ["100%"]
    return ", ".join(words)


@settings(max_examples=100, deadline=None)
@given(plans())
def test_every_valid_plan_reads_back_from_its_canonical_words(text):
    plan = parse_plan(text)
    assert parse_plan(plan.text()) == plan
    assert plan.steps[-1].kind == PROMOTE and len(plan.steps) == text.count(",") + 1
    for i, step in enumerate(plan.steps[:-1]):  # the routing of each step: the share its words give
        assert plan.canary_during(i) == (step.percent if step.kind == CANARY else 0)
        assert plan.shadow_during(i) == max([0] + [s.percent for s in plan.steps[: i + 1] if s.kind == SHADOW][-1:])
