"""`trainserve rollout --approve-before STEP`: the real controller (in process, its clock moving only when it sleeps,
Prometheus played by test_rollout_notify's `Flowing`) holds the route with no canary share before the step and
waits, never pausing, until `trainserve rollout --approve --reason TEXT` appends its record; an approval given
earlier counts, and a controller killed while it waits waits again when run again."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_rollout_controller_plan import exit_code, last_error
from test_rollout_notify import Flowing, Time, controller, receiver  # noqa: F401 (a fixture)
from test_rollout_safety import labels, rollout_events, route, site  # noqa: F401 (a fixture)

from trainserve.cli import main
from trainserve.rollout.labels import Rollout
from trainserve.rollout.notify_sender import parse_receivers


class Killed(Exception):
    """The controller's process gone (a node drained) while it waited."""


def approve(config: Path, reason: str = "dashboards look fine") -> None:
    assert main(["rollout", "--config", str(config), "--approve", "--reason", reason]) == 0


def events(config: Path) -> list[str]:
    return [e["event"] for e in rollout_events(config) if e["event"] not in ("check", "notified")]


def awaiting(config: Path) -> bool:
    return events(config)[-1:] == ["awaiting-approval"]


class Watch:
    """At each sleep of the controller: the route while it waits for approval, and the approval given after
    `approve_after` sleeps of waiting (None: never), or the controller killed after `kill_after`."""

    def __init__(self, config: Path, approve_after: int | None = None, kill_after: int | None = None):
        self.config, self.approve_after, self.kill_after = config, approve_after, kill_after
        self.routes: list[tuple[float, float]] = []

    def __call__(self, n: int) -> None:
        if not awaiting(self.config):
            return
        now = route(self.config)
        self.routes.append((now.shadow_percent, now.canary_percent))
        if len(self.routes) == self.kill_after:
            raise Killed
        if len(self.routes) == self.approve_after:
            approve(self.config)


@pytest.mark.integration
def test_the_controller_holds_the_route_safe_before_the_step_until_a_person_approves(site, receiver):  # noqa: F811
    config, report = site
    prometheus, watch = Flowing(config), Watch(config, approve_after=90)  # 90 s: three times --max-hold
    time = Time(prometheus, watch)
    rollout = controller(config, report, prometheus, time, approve_before="5%", notify=parse_receivers(receiver.url))
    assert rollout.run().promoted and labels(config) == Rollout(stable=2, previous=1)
    assert watch.routes == [(100, 0)] * 90  # the shadow went on, no client got the candidate's answer
    assert events(config) == [
        *("start", "step", "awaiting-approval", "approved", "step", "promote", "promoted"),
    ]
    approved = [e for e in rollout_events(config) if e["event"] == "approved"][0]
    assert approved["reason"] == "dashboards look fine" and "@" in approved["by"]  # user@host of who ran it
    told = [b["event"] for b in receiver.bodies]
    assert told == ["started", "step", "awaiting-approval", "approved", "step", "promoted"]  # told once each
    assert receiver.bodies[3]["approved_by"] == approved["by"] and receiver.bodies[3]["reason"] == approved["reason"]


@pytest.mark.unit
def test_an_approval_given_before_the_controller_reaches_the_step_counts(site):  # noqa: F811
    config, report = site
    prometheus = Flowing(config)
    given = []

    def approve_at_the_first_look(n: int) -> None:
        if not given:
            given.append(approve(config, "approved ahead"))

    time = Time(prometheus, approve_at_the_first_look)
    assert controller(config, report, prometheus, time, approve_before="2").run().promoted
    assert "awaiting-approval" not in events(config)


@pytest.mark.integration
def test_a_controller_killed_while_waiting_waits_again_with_the_route_safe(site):  # noqa: F811
    config, report = site
    prometheus = Flowing(config)
    first = Watch(config, kill_after=5)
    with pytest.raises(Killed):
        controller(config, report, prometheus, Time(prometheus, first), approve_before="100%").run()
    assert first.routes == [(100, 0)] * 5  # before the promotion: the 5 % step's routing without its share
    again = Watch(config, approve_after=20)
    assert controller(config, report, prometheus, Time(prometheus, again), approve_before="100%").run().promoted
    assert again.routes == [(100, 0)] * 20  # waited again, from its first look, never with a canary share
    assert events(config).count("awaiting-approval") == 1  # one wait, told once
    after = events(config)[events(config).index("approved") :]
    assert after[1] == "resumed" and after[-2:] == ["promote", "promoted"]  # the rerun is on the record


@pytest.mark.unit
@pytest.mark.parametrize(
    ("more", "fragment"),
    [
        pytest.param(
            ["--approve-before", "30%", "--prometheus", "http://p:9090"],
            "--approve-before 30%: expected a step of the plan 'shadow 100% 1s, 5% 1s, 100%': its number (1 to 3) "
            "or its share (5%, 100%)",
            id="no-such-step",
        ),
        pytest.param(["--approve-before", "last"], "expected a step number (1 for the first), a share", id="word"),
        pytest.param(["--approve"], "--approve: expected --reason TEXT", id="no-reason"),
        pytest.param(["--approve", "--reason", "ok"], "no rollout of model m is in progress", id="no-rollout"),
        pytest.param(["--approve", "--abort", "--reason", "x"], "--approve with --abort: expected one", id="both"),
        pytest.param(["--notify", "hooks.example/x"], "expected an http(s) URL", id="notify-url"),
    ],
)
def test_bad_approval_and_notify_input_is_one_line_and_moves_nothing(site, capsys, more, fragment):  # noqa: F811
    config, report = site
    argv = [
        *("rollout", "--config", str(config), "--candidate", "2", "--report", str(report)),
        *("--routing-file", str(config.parent / "routing.json"), "--plan", "shadow 1s, 5% 1s, 100%", *more),
    ]
    before = rollout_events(config)
    assert exit_code(argv) == 2
    assert fragment in last_error(capsys)
    assert rollout_events(config) == before
