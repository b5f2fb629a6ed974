"""The bake after the promotion (trainserve.rollout.bake): the real controller in process, its clock moving only when
it sleeps, Prometheus played by `Served` (one proxy replica in front of a server whose versions each answer as the
test says, counted per version and route as the proxy counts them, split as the routing file and the labels say).
A version that fails after its promotion is moved back to previous, labels swapped before it unloads; an identical
one is kept once the bake's time is up; a kill during the bake resumes it with its counts; --abort and
`trainserve rollback` during it; the dry run and the START record state it."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_rollout_notify import Time
from test_rollout_safety import labels, rollout_events, route, site_in

from trainserve.cli import main
from trainserve.errors import TrainserveError
from trainserve.proxy.routing import read_routing
from trainserve.rollout.analysis import FAIL
from trainserve.rollout.bake_checks import errors_check
from trainserve.rollout.bake_size import CAP, FLOOR, UNSIZED, bake_of
from trainserve.rollout.config_file import history_path, read_config, write_config
from trainserve.rollout.controller import Controller
from trainserve.rollout.history import read_history
from trainserve.rollout.labels import Rollout, apply_rollout
from trainserve.rollout.measure import THRESHOLD, queries
from trainserve.rollout.notify import ANNOUNCED, Where, alertmanager, document
from trainserve.rollout.progress import in_progress
from trainserve.rollout.rollout_config import RolloutConfig, StepGate
from trainserve.rollout.sizing.auto import resolve

pytestmark = pytest.mark.unit

PLAN = "shadow 10s, 5% 10s, 100%"
BAKE = 20.0


class Killed(Exception):
    """The controller's process gone during the bake."""


class Served:
    """Prometheus as it sees one proxy replica, `a`: `rate` requests a second to `stable` while the controller sleeps,
    routed as the routing file says, each answered by the version the labels name. `failing` and `slow`: per
    version, the share of its calls that fail, and whether every call is slower than stable's p99 (the first
    bucket's 1 ms), once it is `stable` (`also_copies`: its failures meet the copies to the other version too)."""

    def __init__(self, config: Path, rate: float = 100_000.0):
        self.config, self.routing, self.rate = config, config.parent / "routing.json", rate
        self.failing: dict[int, float] = {}
        self.slow: set[int] = set()
        self.also_copies = False
        self.calls: dict[tuple, float] = defaultdict(float)  # (version, route, what) -> count
        self.copies: dict[tuple, float] = defaultdict(float)  # (version, what) -> count
        self.names = {
            q: (name, cand, stable)
            for cand, stable in ((2, 1), (1, 2))
            for le in (None, "1000")
            for name, q in queries("m", cand, stable, "proxy", le, le).items()
        }

    def flow(self, seconds: float) -> None:
        now = read_routing(self.routing).route("m")
        shadow, canary = (now.shadow_percent, now.canary_percent) if now else (0.0, 0.0)
        stable, calls = labels(self.config).stable, self.rate * seconds
        to_candidate = calls * canary / 100 if now else 0.0
        if to_candidate:
            self._answer(now.candidate, "canary", to_candidate, stable)
        failed = self._answer(stable, "stable", calls - to_candidate, stable)
        if now and shadow:
            copies = (calls - to_candidate - failed) * shadow / 100
            lost = copies * self.failing.get(stable, 0.0) if self.also_copies else 0.0
            for what, more in {"compared": copies - lost, "error": lost, "pairs": copies - lost}.items():
                self.copies[now.candidate, what] += more

    def _answer(self, version: int, route: str, count: float, stable: int) -> float:
        failed = count * self.failing.get(version, 0.0) if version == stable else 0.0
        self.calls[version, route, "requests"] += count
        self.calls[version, route, "errors"] += failed
        self.calls[version, route, "slow"] += count if version in self.slow and version == stable else 0.0
        return failed

    def count(self, name: str, cand: int, stable: int) -> float:
        by_route = {"canary": (cand, "canary"), "stable": (stable, "stable")}
        kind, _, what = name.partition("_")
        if kind in by_route and what in ("requests", "errors"):
            return self.calls[(*by_route[kind], what)]
        version = {"candidate": cand, "stable": stable}.get(kind)
        if version is not None:  # latency: every call the version answered, whatever its route
            key = "requests" if what == "latency_count" else "slow"
            return sum(self.calls[version, r, key] for r in ("canary", "stable"))
        copy = {"shadow_compared": "compared", "shadow_errors": "error", "shadow_pairs": "pairs"}
        copy |= {"shadow_classified": "pairs", "copies_latency_count": "compared"}
        return self.copies[cand, copy[name]] if name in copy else 0.0

    def value(self, expr: str) -> float | None:
        return 1000.0 if expr == "vector(time())" else None

    def series(self, expr: str) -> list[tuple[dict, float]]:
        if expr == 'up{job="proxy"}' or expr.startswith("present_over_time("):
            return [({"instance": "a"}, 1.0)]
        if expr.startswith("timestamp(up"):
            return [({"instance": "a"}, 2000.0)]
        if expr.startswith(":trainserve:proxy:canary_percent{"):
            now = read_routing(self.routing).route("m")
            return [({"instance": "a", "version": str(now.candidate)}, now.canary_percent)] if now else []
        found = self.names.get(expr)
        if found is None:
            return []
        if found[0] == THRESHOLD:
            return [({"le": "1000"}, 100.0), ({"le": "+Inf"}, 100.0)]
        return [({"instance": "a"}, float(math.floor(self.count(*found))))]


class Server:
    """A server that has applied every change; records the labels at each wait, in order."""

    def __init__(self, config: Path):
        self.config, self.waits = config, []

    def wait_available(self, model, version, wait):
        pass

    def wait_label(self, model, label, version, wait):
        self.waits.append(("label", label, version, labels(self.config)))

    def wait_unloaded(self, model, version, wait):
        self.waits.append(("unloaded", version, labels(self.config)))


@pytest.fixture
def bed(tmp_path) -> tuple[Path, Path]:
    """Model m: version 1 stable, version 2 the candidate with a passing report (test_rollout_safety's site)."""
    return site_in(tmp_path)


def controller(config: Path, report: Path, served: Served, time: Time, **more) -> Controller:
    settings = {"interval": 2.0, "wait": 5.0, "max_hold": 30.0, "plan": PLAN, "bake": BAKE, **more}
    rollout = RolloutConfig(config=config, routing_file=config.parent / "routing.json", report=report, **settings)
    rollout.prometheus = "http://prometheus.invalid:9090"
    return Controller(rollout, served, Server(config), clock=time.clock, sleep=time.sleep)


def events(config: Path) -> list[str]:
    return [e["event"] for e in rollout_events(config) if e["event"] not in ("check", "notified")]


def baking(config: Path) -> bool:
    return events(config)[-1:] == ["bake"] or events(config)[-2:] == ["bake", "resumed"]


def test_a_version_that_fails_10_percent_once_promoted_is_moved_back_to_previous_within_the_bake(bed):
    config, report = bed
    served = Served(config)
    served.failing[2] = 0.10  # only once it answers as stable
    routes = []
    time = Time(served, lambda n: routes.append(route(config)) if baking(config) else None)
    rollout = controller(config, report, served, time)
    outcome = rollout.run()
    assert not outcome.promoted and "bake_errors" in outcome.said
    assert events(config)[-5:] == ["promote", "promoted", "bake", "rollback", "rolled-back"]
    assert labels(config) == Rollout(stable=1) and route(config) is None
    assert {(r.candidate, r.shadow_percent, r.canary_percent) for r in routes} == {(1, 100, 0)}
    swapped, gone = rollout.server.waits[-2:]  # stable moved to previous while both were loaded, then 2 unloaded
    assert swapped == ("label", "stable", 1, Rollout(stable=1, previous=2))
    assert gone == ("unloaded", 2, Rollout(stable=1))
    looks = [e for e in rollout_events(config) if e["event"] == "check" and e.get("bake")]
    assert len(looks) <= 3 and looks[-1]["decision"] == "rollback"  # the first looks with counts show it
    said = rollout_events(config)[-1]["said"]
    assert "error share" in said and "vs previous's" in said and "before the switch (step 2)" in said
    page = outcome.report.read_text()
    assert "After the promotion: bake 20s" in page and "during the bake 20s after its promotion" in page


def test_the_notifications_say_the_bake_and_a_rollback_during_it(bed):
    config, report = bed
    served = Served(config)
    served.failing[2] = 0.10
    controller(config, report, served, Time(served)).run()
    records, where = rollout_events(config), Where(history_path(config))
    start = records[0]
    told = {
        r["event"]: document(ANNOUNCED[r["event"]], start, r, None, where) for r in records if r["event"] in ANNOUNCED
    }
    assert told["bake"]["summary"] == "model m version 2: bake 20s begun, previous version 1 kept loaded"
    assert told["promoted"]["bake_seconds"] == BAKE  # Alertmanager's alert stays firing through the bake
    assert [alertmanager(told[e])["alerts"][0]["status"] for e in ("promoted", "rollback")] == ["firing", "resolved"]
    assert told["rollback"]["summary"].startswith(
        "model m version 2 rolled back at the bake after its promotion (stable back to previous): bake_errors: "
    )


def test_a_version_slower_than_previous_once_promoted_is_rolled_back_by_its_slow_calls(bed):
    config, report = bed
    served = Served(config)
    served.slow.add(2)
    outcome = controller(config, report, served, Time(served)).run()
    assert not outcome.promoted and outcome.said.split(":")[1].strip() == "bake_slow_calls"
    assert labels(config) == Rollout(stable=1)


def test_an_identical_version_is_kept_once_its_bake_is_over_and_the_rollout_ends_then(bed):
    config, report = bed
    served = Served(config)
    time = Time(served)
    outcome = controller(config, report, served, time).run()
    assert outcome.promoted and "baked" in outcome.said
    assert events(config)[-4:] == ["promote", "promoted", "bake", "baked"]
    assert rollout_events(config)[0]["bake"] == {"seconds": BAKE, "auto": False, "said": "bake 20s (--bake)"}
    begun = next(e for e in rollout_events(config) if e["event"] == "bake")
    assert time.now - begun["started"] >= BAKE  # watched for the whole bake
    assert labels(config) == Rollout(stable=2, previous=1) and route(config) is None
    assert in_progress(read_history(history_path(config)), "m") is None
    assert outcome.report is not None and "its bake ended" in outcome.report.read_text()


def test_an_outage_on_both_versions_during_the_bake_rolls_nothing_back(bed):
    config, report = bed
    served = Served(config)
    served.failing[2] = 0.3  # from the switch on (steady: see docs/progressive-delivery.md for one that begins later)
    served.also_copies = True  # the copies to previous fail alike: a fault of the server, not of the version
    outcome = controller(config, report, served, Time(served)).run()
    assert outcome.promoted, outcome.said
    looks = [e for e in rollout_events(config) if e["event"] == "check" and e.get("bake")]
    held = [c for e in looks for c in e["checks"] if "held back" in c["said"]]
    assert held and held[0]["name"] == "bake_errors"


def test_a_controller_killed_during_the_bake_resumes_it_with_its_counts_and_the_time_it_had_left(bed):
    config, report = bed
    served = Served(config)
    looks = []

    def kill_in_the_bake(n: int) -> None:
        if baking(config):
            looks.append(n)
            if len(looks) == 4:
                raise Killed

    time = Time(served, kill_in_the_bake)
    with pytest.raises(Killed):
        controller(config, report, served, time).run()
    assert in_progress(read_history(history_path(config)), "m").promoted
    served.failing[2] = 0.10
    again = controller(config, report, served, Time(served))
    again.clock = lambda: time.now  # the same clock: the bake's time left is what it had
    outcome = again.run()
    assert not outcome.promoted and labels(config) == Rollout(stable=1)
    assert events(config)[-5:] == ["promoted", "bake", "resumed", "rollback", "rolled-back"]


def killed_in_the_bake(config: Path, report: Path) -> Served:
    """A controller killed at its first wait in the bake; returns the traffic it was serving."""
    served = Served(config)

    def kill_in_the_bake(n: int) -> None:
        if baking(config):
            raise Killed

    with pytest.raises(Killed):
        controller(config, report, served, Time(served, kill_in_the_bake)).run()
    return served


def test_abort_during_the_bake_moves_stable_back_and_rollback_refuses_meanwhile(bed, capsys):
    config, report = bed
    served = killed_in_the_bake(config, report)
    assert main(["rollback", "--config", str(config), "--reason", "x"]) == 2
    assert "rollback refused: a rollout of model m version 2 is in progress" in capsys.readouterr().err
    outcome = controller(config, report, served, Time(served), abort=True, reason="pager").run()
    assert not outcome.promoted and labels(config) == Rollout(stable=1)
    assert rollout_events(config)[-1]["said"] == "aborted during the bake: pager"


def test_bake_0_ends_the_rollout_at_its_promotion(bed):
    config, report = bed
    served = Served(config)
    outcome = controller(config, report, served, Time(served), bake=0.0).run()
    assert outcome.promoted and events(config)[-2:] == ["promote", "promoted"]
    assert in_progress(read_history(history_path(config)), "m") is None


def test_the_start_record_and_the_dry_run_state_the_bake(bed, capsys):
    config, report = bed
    argv = ["rollout", "--config", str(config), "--routing-file", str(config.parent / "r.json"), "--dry-run"]
    assert (
        main(
            [
                *argv,
                "--report",
                str(report),
                "--plan",
                "shadow 10s, 5% 5m, 100%",
                "--expected-rate",
                "100",
                "--bake",
                "auto",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "bake" in out and "(auto): a version twice as slow" in out, out
    assert "previous (1) kept loaded, routed with no canary share, shadow 100% copied to it" in out
    assert main([*argv, "--report", str(report), "--plan", PLAN, "--bake", "0"]) == 0
    assert "no bake (--bake 0)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("rate", "plan", "expected"),
    [(100.0, "5% 5m, 100%", (FLOOR, FLOOR)), (1.0, PLAN, (CAP, CAP)), (None, PLAN, (UNSIZED, UNSIZED))],
    ids=["shown-early", "never-shown", "no-rate"],
)
def test_auto_sizes_the_bake_to_the_rate_within_its_floor_and_cap(rate, plan, expected):
    config = RolloutConfig(plan=plan, expected_rate=rate, interval=30.0)
    resolved = resolve(config, None, "m", {}, False, 0.0)
    bake = bake_of(config, resolved)
    assert bake["auto"] and expected[0] <= bake["seconds"] <= expected[1], bake


def test_bad_bake_input_is_one_line_naming_what_was_expected(capsys):
    with pytest.raises(SystemExit):
        main(["rollout", "--bake", "soon"])
    assert "expected `auto`, 0 (no bake), or a duration such as 30m" in capsys.readouterr().err
    with pytest.raises(TrainserveError, match=r"^--bake 'soon': expected `auto`, 0 \(no bake\), or a duration"):
        RolloutConfig(bake="soon")


@given(
    st.integers(0, 10_000),
    st.integers(1, 10_000),
    st.integers(0, 10_000),
    st.integers(1, 10_000),
)
def test_the_bake_never_fails_a_version_whose_error_share_is_no_higher_than_previous_s(a, n, b, m):
    errors, base = min(a, n), min(b, m)
    if errors * m > base * n:  # stable's share above previous's: not this property's case
        errors = base * n // m
    counts = {"stable_errors": errors, "stable_requests": n, "shadow_errors": 0}
    counts |= {"shadow_compared": 0, "shadow_incomparable": 0}
    baseline = {"errors": base, "requests": m, "step": 1}
    assert errors_check(counts, baseline, StepGate()).result != FAIL


def test_a_bake_rollback_with_no_previous_labelled_moves_nothing_and_says_why(bed):
    config, report = bed
    served = killed_in_the_bake(config, report)
    served_config = read_config(config)
    apply_rollout(served_config.model_config_list.config[0], Rollout(stable=2))  # `previous` dropped by hand
    write_config(config, served_config)
    with pytest.raises(TrainserveError, match="version 2 is stable with no previous version labelled"):
        controller(config, report, served, Time(served), abort=True, reason="pager").run()
    assert labels(config) == Rollout(stable=2)
