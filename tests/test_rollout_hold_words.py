"""A holding rollout says where it stands (issue 57): why it holds once, as a WARNING; then at each look where the
step stands (held how long, how long until it pauses) at INFO; a WARNING again when the reason changes or clears.
The real controller in process, Prometheus played by test_rollout_notify's `Flowing` on its clock."""

from __future__ import annotations

import logging

import pytest
from test_rollout_notify import Flowing, Time, controller
from test_rollout_safety import site  # noqa: F401 (a fixture)

from trainserve.rollout.ends import RolloutPaused
from trainserve.rollout.prometheus import PrometheusUnreachable

pytestmark = pytest.mark.unit
DOWN = "Prometheus at http://prometheus.invalid:9090 cannot be reached: connection refused"


class Down(Flowing):
    """Prometheus unreachable while `down` (set by the test on the controller's sleeps)."""

    down = False

    def series(self, expr: str) -> list[tuple[dict, float]]:
        if self.down and not expr.startswith((":trainserve:proxy:canary_percent{", "up{", "timestamp(up")):
            raise PrometheusUnreachable(DOWN)
        return super().series(expr)


def hold_lines(caplog) -> list[tuple[str, str]]:
    return [
        (r.levelname, r.getMessage())
        for r in caplog.records
        if r.name == "trainserve.rollout.controller" and r.filename == "hold_words.py"
    ]


def test_an_outage_is_said_once_then_where_the_step_stands_then_its_end(site, caplog):  # noqa: F811
    config, report = site
    prometheus = Down(config)
    outage = range(3, 8)  # the controller's sleeps (1 s each) during which Prometheus is down

    def at_sleep(n: int) -> None:
        prometheus.down = n in outage

    caplog.set_level(logging.INFO, logger="trainserve.rollout.controller")
    assert controller(config, report, prometheus, Time(prometheus, at_sleep)).run().promoted
    lines = hold_lines(caplog)
    assert [level for level, _ in lines] == ["WARNING", "INFO", "INFO", "INFO", "INFO", "WARNING"], lines
    assert lines[0][1].startswith(f"model m: step 1 (shadow 100% 10s) holds: {DOWN}; it pauses once held 30s, in 30s")
    assert lines[1][1] == f"model m: step 1 (shadow 100% 10s) held 1s of 30s, pauses in 29s: {DOWN}"
    assert lines[4][1].startswith("model m: step 1 (shadow 100% 10s) held 4s of 30s, pauses in 26s")
    assert lines[5][1] == f"model m: step 1 (shadow 100% 10s) holds no longer, Prometheus answers again (was: {DOWN})"


def test_too_few_requests_is_said_once_then_the_time_left_until_the_pause(site, caplog):  # noqa: F811
    config, report = site
    prometheus = Flowing(config, rate=0)
    caplog.set_level(logging.INFO, logger="trainserve.rollout.controller")
    with pytest.raises(RolloutPaused):
        controller(config, report, prometheus, Time(prometheus)).run()
    lines = hold_lines(caplog)
    warnings = [said for level, said in lines if level == "WARNING"]
    assert len(warnings) == 1 and "fewer than --gate-min-requests" in warnings[0], warnings
    assert warnings[0].startswith("model m: step 1 (shadow 100% 10s) holds: ") and "pauses once held 30s" in warnings[0]
    infos = [said for level, said in lines if level == "INFO"]
    assert infos[-1].startswith("model m: step 1 (shadow 100% 10s) held 29s of 30s, pauses in 1s: not yet decided")
    assert len(infos) == 29, "one line at each look, each saying the time left"


def test_a_hold_that_clears_on_the_next_steps_first_look_names_the_step_it_held(caplog):
    from trainserve.rollout.hold_words import HoldWords

    caplog.set_level(logging.INFO, logger="trainserve.rollout.controller")
    holds = HoldWords("m")
    holds.holding(0, "shadow 100% 10s", "too few requests", held=4.0, limit=30.0)
    holds.cleared("its look decided watch")  # the next step's first look: the hold of step 1 is over
    (said,) = [m for _, m in hold_lines(caplog) if "holds no longer" in m]
    assert said.startswith("model m: step 1 (shadow 100% 10s) holds no longer, its look decided watch"), said
