"""Staging that does not hurt stable: `trainserve candidate --prometheus` watches stable's calls through the proxy
while the version loads (a fake Prometheus here, whose counters move while the fake server "loads"); a load shown to
slow stable, or to make it fail, beyond its budget is unloaded and refused with the damage in one line, a light one
staged, and both recorded in the history. (Live, with serve-local, the proxy and a real Prometheus:
test_staging_watch_live.py.)"""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import assert_one_line_error, run_cli
from trainserve.errors import TrainserveError
from trainserve.rollout.config import CandidateConfig, StagingBudget
from trainserve.rollout.config_file import history_path, new_config, read_config, write_config
from trainserve.rollout.history import read_history
from trainserve.rollout.labels import Rollout, apply_rollout
from trainserve.rollout.measure import threshold
from trainserve.rollout.staging_watch import counters, judge, over_window, per_replica
from trainserve.rollout.steps import stage_candidate

# Stable's last 5 minutes: 90 calls under 1 ms, 9 in (1, 2] ms, 1 above: its p99 exactly 2 ms (weight 0).
BUCKETS = [("1000", 90.0), ("2000", 99.0), ("4000", 100.0), ("+Inf", 100.0)]
BEFORE = {"calls": 10_000, "errors": 10, "timed": 10_000, "above_le": 100, "above_lower": 1000}
NOW = 1e9  # Prometheus's clock


class FakePrometheus:
    """Answers the watch's queries by name: one proxy replica "a" (none with `replicas=False`), stable's buckets,
    its increases over the window before, and its counters now, which `load` moves (what the load did)."""

    def __init__(self, replicas: bool = True):
        self.replicas, self.counted = replicas, dict.fromkeys(BEFORE, 50_000.0)
        self.named = counters("proxy", "m", 1, threshold(BUCKETS))

    def load(self, **added: float) -> None:
        for name, value in added.items():
            self.counted[name] += value

    def series(self, expr: str) -> list[tuple[dict, float]]:
        if expr == 'up{job="proxy"}':
            return [({"instance": "a"}, 1.0)] if self.replicas else []
        if " unless " in expr:  # silent replicas: none
            return []
        if expr.startswith("timestamp("):
            return [({"instance": "a"}, NOW + 1)]
        if expr.startswith("sum by (le)"):
            return [({"le": le}, count) for le, count in BUCKETS]
        (name,) = [n for n, selector in self.named.items() if per_replica(selector, "proxy") == expr]
        return [({"instance": "a"}, self.counted[name])]

    def value(self, expr: str) -> float:
        if expr == "vector(time())":
            return NOW
        (name,) = [n for n, selector in self.named.items() if over_window(selector, "300s") == expr]
        return BEFORE[name]


class LoadingServer:
    """A server whose load of a version moves the fake Prometheus's counters as `during` says; records unloads."""

    def __init__(self, prometheus: FakePrometheus, **during: float):
        self.prometheus, self.during, self.unloaded = prometheus, during, []

    def wait_available(self, model, version, wait):
        self.prometheus.load(**self.during)

    def wait_label(self, model, label, version, wait):
        pass

    def wait_unloaded(self, model, version, wait):
        self.unloaded.append(version)


@pytest.fixture
def site(tmp_path):
    """Model m with versions 1 (stable) and 2 on disk."""
    base = tmp_path / "models" / "m"
    for version in (1, 2):
        (base / str(version)).mkdir(parents=True)
    config = tmp_path / "rollout" / "models.config"
    config.parent.mkdir()
    served = new_config("m", str(base))
    apply_rollout(served.model_config_list.config[0], Rollout(1))
    write_config(config, served)
    return config


def stage(config, server, prometheus, **budget):
    staged = CandidateConfig(config, "m", None, 2, "unused:1", 1, prometheus="http://prometheus:9090")
    staged.stage = StagingBudget(**budget)
    return stage_candidate(staged, server, prometheus=prometheus)


def labels(config) -> tuple[Rollout, list[int]]:
    entry = read_config(config).model_config_list.config[0]
    return Rollout.of(entry), list(entry.model_version_policy.specific.versions)


@pytest.mark.unit
def test_a_load_that_slows_stable_is_unloaded_and_refused_with_the_damage_in_one_line(site):
    prometheus = FakePrometheus()
    server = LoadingServer(prometheus, calls=400, timed=400, above_le=200, above_lower=300)
    with pytest.raises(TrainserveError) as refused:
        stage(site, server, prometheus)
    said = str(refused.value)
    assert said.startswith("staging version 2 slowed stable: 50 % of its calls above its p99 of 2.0 ms (before: 1 %")
    assert "budget +5 points" in said and said.endswith("; unloaded") and "\n" not in said
    assert labels(site) == (Rollout(1), [1]) and server.unloaded == [2]  # the config as it was, the version gone
    record = read_history(history_path(site))[-1]
    assert (record["action"], record["before"], record["after"], record["refused"]) == (
        "candidate",
        *[{"stable": 1}] * 2,
        said,
    )
    staging = record["staging"]
    assert staging["slow"]["hurt"] and staging["slow"]["during"] == [200, 400] and staging["load_seconds"] >= 0
    assert staging["slow"]["before"] == [100, 10_000] and staging["stable_p99_seconds"] == pytest.approx(0.002)


@pytest.mark.unit
def test_a_load_that_makes_stable_fail_is_refused(site):
    prometheus = FakePrometheus()
    server = LoadingServer(prometheus, calls=400, errors=40, timed=400, above_le=4, above_lower=40)
    with pytest.raises(TrainserveError, match=r"^staging version 2 made stable fail: 10 % of its calls failed"):
        stage(site, server, prometheus)
    assert labels(site) == (Rollout(1), [1])


@pytest.mark.unit
def test_a_light_load_is_staged_and_its_duration_and_shares_recorded(site, caplog):
    prometheus = FakePrometheus()
    server = LoadingServer(prometheus, calls=400, timed=400, above_le=4, above_lower=40)
    with caplog.at_level(logging.INFO):
        change = stage(site, server, prometheus)
    assert change.after == Rollout(1, None, 2) and labels(site) == (Rollout(1, None, 2), [1, 2])
    staging = change.record["staging"]
    assert staging["watched"] and staging["judged"] and not staging["slow"]["hurt"] and not staging["errors"]["hurt"]
    assert (
        "stable's 400 calls meanwhile not shown hurt beyond the budget: above its p99 1 % (before 1 %), failed 0 % "
        "(before 0 %)" in caplog.text
    )


@pytest.mark.unit
def test_too_few_calls_during_the_load_stage_it_unjudged_and_say_so(site, caplog):
    prometheus = FakePrometheus()
    server = LoadingServer(prometheus, calls=20, timed=20, above_le=2, above_lower=2)
    with caplog.at_level(logging.INFO):
        change = stage(site, server, prometheus)
    assert change.after.candidate == 2 and change.record["staging"]["judged"] is False
    assert (
        "20 calls of stable while it loaded, fewer than --stage-min-calls 100: the load cannot be judged" in caplog.text
    )


@pytest.mark.unit
def test_a_load_that_starves_stable_is_refused_on_few_calls_when_the_damage_is_certain(site):
    prometheus = FakePrometheus()
    server = LoadingServer(prometheus, calls=60, timed=60, above_le=60, above_lower=60)
    with pytest.raises(TrainserveError, match="100 % of its calls above its p99"):
        stage(site, server, prometheus)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("prometheus", "said"),
    [(None, "no --prometheus"), (FakePrometheus(replicas=False), "no proxy replica scraped as job 'proxy'")],
)
def test_where_nothing_watches_it_is_said_and_staged_as_before(site, caplog, prometheus, said):
    staged = CandidateConfig(site, "m", None, 2, "unused:1", 1)
    change = stage_candidate(staged, LoadingServer(FakePrometheus()), prometheus=prometheus)
    assert change.after.candidate == 2
    assert change.record["staging"]["watched"] is False and change.record["staging"]["why"].startswith(said)
    assert f"stable's calls not watched while version 2 loads: {said}" in caplog.text


@pytest.mark.unit
@given(st.integers(0, 1000), st.integers(1, 5000), st.integers(0, 1000), st.integers(1, 5000))
def test_a_load_that_changes_no_share_is_never_refused(events, n, before_events, before_n):
    """Whatever the counts, a share during the load no higher than before is never shown above a budget >= 0."""
    during = (min(events, n), n)
    before = (min(before_events, before_n), before_n)
    if during[0] / during[1] <= before[0] / before[1]:
        assert not judge("slow", during, before, 0.0, StagingBudget(min_calls=1)).hurt


@pytest.mark.unit
def test_the_budgets_are_flags_and_bad_ones_are_refused_in_one_line(tmp_path):
    out = run_cli("candidate", "--help")
    for flag in ("--stage-max-slow-increase", "--stage-max-error-increase", "--stage-min-calls", "--stage-baseline"):
        assert flag in out.stdout
    assert_one_line_error(run_cli("candidate", "--config", str(tmp_path / "c"), "--stage-alpha", "1"), "--stage-alpha")
