"""The plan `auto` (trainserve.rollout.sizing): sized from the traffic by the controller's own checks, refused
before anything moves when it cannot decide in time, and the rate it is sized for read by queries that real
Prometheus (promtool's evaluator, over a week of synthetic series) answers as the docs say."""

from __future__ import annotations

import argparse
import functools
import math
import shutil
import subprocess

import numpy as np
import pytest
import yaml

from conftest import require
from trainserve.errors import TrainserveError
from trainserve.rollout import analysis
from trainserve.rollout.plan import CANARY, PROMOTE, SHADOW, Step, parse_plan, plan_or_auto
from trainserve.rollout.rollout_config import RolloutConfig, StepGate
from trainserve.rollout.sizing.choose import Limits, PlanRefused, hours, size_plan
from trainserve.rollout.sizing.expect import expect_plan, totals
from trainserve.rollout.sizing.simulate import Situation, pass_times
from trainserve.rollout.sizing.traffic import (
    Traffic,
    hours_of,
    last_hour_query,
    rate_query,
    read_traffic,
    seen_query,
    slowest_hour_query,
)
from trainserve.stats.sequential import difference_sequence

OFFLINE = {"disagreement": {"source": "eval", "count": 200, "examples": 10_000, "candidate": 2, "baseline": 1}}
DEFAULTS = RolloutConfig()
LIMITS = Limits(DEFAULTS.target_duration, DEFAULTS.max_duration, DEFAULTS.max_exposure)


def situation(rate: float, errors: float = 0.0, interval: float = 30.0) -> Situation:
    return Situation(Traffic(rate, errors), StepGate(), OFFLINE, True, interval)


@functools.cache
def sized_at(rate: float):
    """The plan auto sizes at `rate` with the defaults, sized once for the tests that read it."""
    return size_plan(situation(rate), LIMITS)


@pytest.mark.integration
@pytest.mark.parametrize("rate", [10, 100, 1000])
def test_auto_fits_the_limits_and_states_what_each_step_takes(rate):
    plan, expected = sized_at(rate)
    kinds = [s.kind for s in plan.steps]
    assert kinds[0] == SHADOW and kinds[-1] == PROMOTE and CANARY in kinds
    assert all(s.hold is not None and s.hold > 0 for s in plan.steps[:-1])
    median, p90, most = totals(expected)
    assert median <= p90 <= most <= LIMITS.most
    assert all(e.pause <= 0.02 for e in expected)  # each step's hold covers its 99th percentile
    first = next(e for e in expected if e.step.kind == CANARY)
    assert first.first_look <= LIMITS.exposure
    assert parse_plan(plan.text()) == plan  # what the START record keeps reads back the same


@pytest.mark.integration
def test_more_traffic_gets_a_smaller_share_and_a_quicker_plan():
    first_share = {}
    for rate in (10, 100):
        plan, expected = sized_at(rate)
        first_share[rate] = next(s.percent for s in plan.steps if s.kind == CANARY)
        assert totals(expected)[0] <= LIMITS.target  # both rates can meet the 30-minute target
    assert first_share[100] < first_share[10]


@pytest.mark.integration  # sizes a plan: seconds of simulation, unless another test of the worker sized it first
def test_a_canary_steps_duration_is_what_the_checks_need_by_an_independent_count():
    """The median canary requests of the sized step lie near the count at which an identical candidate's expected
    counts put the difference bounds within budget (computed here from the bounds alone, no simulation)."""
    plan, expected = sized_at(10)
    step = next(e for e in expected if e.step.kind == CANARY)
    share = step.step.percent / 100
    needed = needed_to_pass(0.01, 0.01, share)  # the slow-call check: 1 % of each version's calls above the p99
    assert 0.5 * needed <= step.requests <= 2.0 * needed, (step.requests, needed)


def needed_to_pass(rate: float, budget: float, share: float) -> int:
    def within(n: int) -> bool:
        stable = round(n * (1 - share) / share)
        bounds = difference_sequence((round(rate * n), n), (round(rate * stable), stable), 0.05, analysis.CANARY_ALPHA)
        return bounds[1] <= budget

    return next(n for n in (int(100 * 1.05**k) for k in range(200)) if within(n))


@pytest.mark.integration
def test_too_little_traffic_is_refused_before_anything_moves_saying_what_would_decide():
    with pytest.raises(PlanRefused) as refused:
        size_plan(situation(1, errors=0.01), LIMITS)
    said = str(refused.value)
    assert "--max-duration 8h 0m" in said and "1 requests/s" in said and "error share 1.00%" in said
    assert "--plan" in said
    needed = said.split("expected --max-duration ")[1].split(",")[0]
    longer = Limits(LIMITS.target, duration_of(needed), LIMITS.exposure)
    plan, expected = size_plan(situation(1, errors=0.01), longer)  # the time it said is enough
    assert totals(expected)[2] <= longer.most


def duration_of(words: str) -> float:
    h, m = words.split("h ") if "h " in words else ("0", words)
    return int(h) * 3600 + int(m.rstrip("m")) * 60


@pytest.mark.unit
def test_a_first_look_beyond_the_exposure_cap_is_refused():
    with pytest.raises(PlanRefused, match="more than --max-exposure 100"):
        size_plan(situation(1000), Limits(LIMITS.target, LIMITS.most, 100))


@pytest.mark.integration
def test_sizing_is_seeded_the_dry_run_and_the_start_agree():
    assert size_plan(situation(100), LIMITS)[0] == sized_at(100)[0]  # sized anew, the same plan


@pytest.mark.unit
def test_an_explicit_plans_expectations_show_it_would_pause():
    """The former default plan at 10 requests/s: its 5 % step cannot show the slow-call budget in 10 minutes plus
    the default 30-minute hold in most runs, and the dry run says so."""
    plan = parse_plan("shadow 10m, 5% 10m, 25% 10m, 100%")
    expected = expect_plan(plan, situation(10), DEFAULTS.max_hold)
    assert expected[1].pause > 0.5
    assert math.isinf(totals(expected)[1])


@pytest.mark.unit
def test_pass_times_on_a_coarse_grid_when_the_looks_are_many():
    times = pass_times(Step(CANARY, 25.0, 1.0), 100.0, 25.0, situation(10, interval=0.25), 4 * 3600)
    finite = times[np.isfinite(times)]
    grid = finite / (4 * 3600 / 1000)  # every 14.4 s: a thousand looks over the horizon, not 57,600
    assert len(finite) > 0.95 * len(times) and np.allclose(grid, np.round(grid))


@pytest.mark.unit
def test_plan_steps_carry_their_hold():
    plan = parse_plan("shadow 90s hold 3m, 25% 25m hold 30m, 100%")
    assert [(s.seconds, s.hold) for s in plan.steps] == [(90, 180), (1500, 1800), (0, None)]
    assert plan.text() == "shadow 100% 90s hold 180s, 25% 1500s hold 1800s, 100%"
    assert plan_or_auto(" auto ") == "auto"
    with pytest.raises(argparse.ArgumentTypeError, match="then optionally `hold DURATION`"):
        parse_plan("5% 10m hold, 100%")


@pytest.mark.unit
def test_hours_reads_as_a_person_writes_it():
    assert [hours(s) for s in (45, 90, 1500, 3600, 6060)] == ["45s", "2m", "25m", "1h 0m", "1h 41m"]


# -- the rate it is sized for ----------------------------------------------------------------------------------


@pytest.mark.unit
def test_the_hours_of_a_plan_wrap_around_midnight():
    assert hours_of(13 * 3600 + 1200, 4 * 3600) == "(hour() >= 13 and hour() <= 17)"
    assert hours_of(22 * 3600, 4 * 3600) == "(hour() >= 22 or hour() <= 2)"
    assert hours_of(0, 24 * 3600) is None


class Answers:
    """A Prometheus whose instant queries are answered from a table (None: no series)."""

    def __init__(self, slowest, last, errors=0.0):
        self.slowest, self.last, self.errors = slowest, last, errors

    def value(self, expr: str):
        if expr.startswith("min_over_time"):
            return self.slowest
        return self.errors if "status!~" in expr else self.last


@pytest.mark.unit
def test_read_traffic_takes_the_slowest_hour_else_the_last_and_refuses_on_none():
    read = lambda answers, history="7d": read_traffic(answers, "m", "proxy", history, 0.0, 3600.0)  # noqa: E731
    assert read(Answers(2.0, 9.0, 0.01)) == Traffic(
        2.0, 0.01, "the slowest hour at these hours of the day over the last 7d"
    )
    assert read(Answers(None, 9.0)).source == "the last hour" and read(Answers(None, 9.0)).rate == 9.0
    assert read(Answers(2.0, 9.0), history="").rate == 9.0
    with pytest.raises(TrainserveError, match="an hour without calls"):
        read(Answers(0.0, 9.0))
    with pytest.raises(TrainserveError, match="no call of model m"):
        read(Answers(None, None))


@pytest.mark.unit
def test_a_steady_rate_read_twice_sizes_one_plan():
    """A dry run and the start a minute later read the rate a little apart: both size for the same two figures (and
    so the same plan: the sizing is seeded by the traffic)."""
    read = lambda last: read_traffic(Answers(None, last, 0.01234), "m", "proxy", "7d", 0.0, 3600.0)  # noqa: E731
    assert read(9.98) == read(10.03) == Traffic(10.0, 0.012, "the last hour")


def promtool_answers(tmp_path, interval: str, series: list[dict], cases: list[dict]) -> None:
    """promtool evaluates each case over `series` (promtool's input_series) as the case expects."""
    require("promtool", shutil.which("promtool") is not None, "Debian's prometheus package evaluates the queries")
    spec = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [{"interval": interval, "input_series": series, "promql_expr_test": cases}],
    }
    path = tmp_path / "sizing.yml"
    path.write_text(yaml.safe_dump(spec))
    proc = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def case(expr: str, at: float, value: float | None) -> dict:
    """A promtool case: `expr` at `at` (seconds) is `value` (None: no series)."""
    samples = [] if value is None else [{"labels": "{}", "value": value}]
    return {"expr": expr, "eval_time": f"{int(at)}s", "exp_samples": samples}


@pytest.mark.unit
def test_prometheus_answers_a_models_rate_from_its_first_minutes(tmp_path):
    """A model first called 400 s ago at 10 requests/s (an error a second over the last 200 s), scraped every
    second: the last hour's rate is over the 400 s Prometheus saw (rate() over [1h] alone reads 1.2); and no slowest
    hour is found, since Prometheus saw no hour from its start (the subquery would take its first minutes for one).
    The counters start at 0, so that rate() extrapolates nothing before their first sample."""
    labels = 'job="proxy",model_name="m",version="1",route="direct"'
    series = [
        {"series": f':trainserve:proxy:request_count{{{labels},status="OK"}}', "values": "_x3620 0+10x400"},
        {"series": f':trainserve:proxy:request_count{{{labels},status="UNAVAILABLE"}}', "values": "_x3820 0+1x200"},
    ]
    now = 4020  # promtool's series are loaded up to its last evaluation (every minute): at one, all of them
    cases = [
        case(seen_query("m", "proxy"), now, 400),
        case(last_hour_query("m", "proxy"), now, 10.5),
        case(slowest_hour_query("m", "proxy", "7d", now, 3600), now, None),
        case(slowest_hour_query("m", "proxy", "7d", now, 86400), now, None),
    ]
    promtool_answers(tmp_path, "1s", series, cases)


@pytest.mark.unit
def test_prometheus_answers_the_slowest_hour_at_the_plans_hours(tmp_path):
    """Seven days of a model at 10 requests/s from 00:00 to 12:00 UTC and 2 requests/s after: a plan begun at
    13:00 is sized for 2, one begun at 02:00 for 10, and the last hour's rate is what it was."""
    step = 300
    values, total = [], 0.0
    for i in range(7 * 24 * 12 + 24 * 12):
        values.append(total)
        total += step * (10.0 if (i * step // 3600) % 24 < 12 else 2.0)
    series = ':trainserve:proxy:request_count{job="proxy",model_name="m",version="1",status="OK",route="direct"}'
    day7 = 7 * 86400
    span = 4 * 3600
    cases = [
        case(slowest_hour_query("m", "proxy", "7d", day7 + 13 * 3600, span), day7 + 13 * 3600, 2.0),
        case(slowest_hour_query("m", "proxy", "7d", day7 + 2 * 3600, span), day7 + 2 * 3600, 10.0),
        case(rate_query("m", "proxy"), day7 + 6 * 3600, 10.0),
        case(last_hour_query("m", "proxy"), day7 + 6 * 3600, 10.0),
    ]
    promtool_answers(tmp_path, f"{step}s", [{"series": series, "values": " ".join(f"{v:g}" for v in values)}], cases)
