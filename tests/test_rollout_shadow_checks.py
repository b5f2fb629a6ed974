"""`trainserve rollout` judging the shadow's answers of every model (issue 55), against a real Prometheus scraping a
stand-in proxy (test_rollout_controller's traffic model, its shadow pairs counted by stable's class, or against the
routing file's tolerance, as the proxy counts them): a candidate flipping 30 % of one class and 1 % overall is
rolled back at the shadow step, where the overall flip rate alone passes it; a regression candidate whose error
doubled is rolled back at the shadow step, and one that differs from stable as its replay said is promoted."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from reports import regression_replay_report, regression_report, write
from test_rollout_controller import Traffic, events, labels, rollout_args, site, watched  # noqa: F401

from trainserve.cli import main
from trainserve.proxy.routing import read_routing
from trainserve.rollout.labels import Rollout

pytestmark = pytest.mark.integration  # a Prometheus process, sockets

P = ":trainserve:proxy:"
# Stable's classes among the classified pairs: class 7 is 3 % of them, the rest alike.
CLASS_SHARES = {str(c): 0.97 / 9 for c in range(10) if c != 7} | {"7": 0.03}


class ByClass(Traffic):
    """A classifier's traffic whose shadow pairs are also counted by stable's class (`class_flips`: each class's
    flip share), each class's series on the page from its first pair, as the proxy's."""

    def __init__(self, routing: Path, class_flips: dict[str, float]):
        super().__init__(routing, 1, 2, flip_share=sum(CLASS_SHARES[c] * f for c, f in class_flips.items()))
        self.class_flips = class_flips
        self.classes: dict[str, list[float]] = {}  # class -> [pairs, flips]

    def tick(self) -> None:
        before = self.shadow["pairs"]
        super().tick()
        new = self.shadow["pairs"] - before
        for label, share in CLASS_SHARES.items() if new else ():
            seen = self.classes.setdefault(label, [0.0, 0.0])
            seen[0] += new * share
            seen[1] += new * share * self.class_flips[label]

    def lines(self) -> list[str]:
        cand = f'model_name="{self.model}",version="{self.candidate}"'
        out = super().lines()
        for label, (pairs, flips) in sorted(self.classes.items()):
            out.append(f'{P}shadow_class_pairs{{{cand},class="{label}"}} {math.floor(pairs)}')
            out.append(f'{P}shadow_class_flips{{{cand},class="{label}"}} {math.floor(flips)}')
        return out


def test_a_candidate_flipping_30_percent_of_one_class_and_1_percent_overall_is_rolled_back_at_the_shadow_step(
    watched,  # noqa: F811
    tmp_path,
    capsys,
):
    proxy, prometheus = watched
    config, report = site(tmp_path, "one-class")
    flips = {c: 0.001 for c in CLASS_SHARES} | {"7": 0.30}
    traffic = proxy.add("one-class", ByClass(config.parent / "routing.json", flips))
    assert 0.0095 <= traffic.flip_share <= 0.0105  # the average hides it: flip_rate's budget is 6 %
    assert main(rollout_args(config, report, prometheus)) == 1
    out = capsys.readouterr().out
    assert out.startswith("rolled back: model one-class version 2: flip_classes: class 7: flips"), out
    history = events(config)
    assert [e["step"] for e in history if e["event"] == "step"] == [0]  # the shadow step only
    last = [e for e in history if e["event"] == "check"][-1]
    judged = {c["name"]: c["result"] for c in last["checks"]}
    assert judged["flip_classes"] == "fail" and judged["flip_rate"] != "fail"
    assert last["counts"]["shadow_class_pairs:7"] > 0 and "shadow_class_flips:0" in last["counts"]
    assert not [k for k in traffic.requests if k[2] == "canary"]  # no client ever got its answer
    assert labels(config) == Rollout(stable=1)


class Regression(Traffic):
    """A regression model's traffic: its shadow pairs compared against the routing file's shadow_tolerance, as the
    proxy compares them (none classified), `beyond` of them differing by more."""

    def __init__(self, routing: Path, beyond: float):
        super().__init__(routing, 1, 2)
        self.beyond, self.tolerated, self.tolerances = beyond, [0.0, 0.0], set()

    def tick(self) -> None:
        before = self.shadow["pairs"]
        super().tick()
        route = read_routing(self.routing).route(self.model)
        if route is not None and route.shadow_tolerance is not None:  # the proxy counts them only with one
            self.tolerances.add(route.shadow_tolerance)
            new = self.shadow["pairs"] - before
            self.tolerated = [self.tolerated[0] + new, self.tolerated[1] + new * self.beyond]

    def lines(self) -> list[str]:
        cand = f'model_name="{self.model}",version="{self.candidate}"'
        out = [line for line in super().lines() if "classified_pairs" not in line and "shadow_flips" not in line]
        if self.tolerated[0]:
            out.append(f"{P}shadow_tolerated_pairs{{{cand}}} {math.floor(self.tolerated[0])}")
            out.append(f"{P}shadow_beyond_tolerance{{{cand}}} {math.floor(self.tolerated[1])}")
        return out


def regression_site(tmp_path: Path, model: str) -> tuple[Path, Path, Path]:
    """Regression model `model`: version 1 stable (MAE 0.8), version 2 the candidate, its eval report and a replay
    that showed 2 % of its answers beyond 0.8 from stable's; returns (config, eval report, replay report)."""
    config, _ = site(tmp_path, model)
    report = write(
        regression_report(tmp_path / "models" / model / "2", 1, model, mae=0.8), tmp_path / "regression.json"
    )
    differences = np.r_[np.full(40, 1.0), np.full(1960, 0.1)]
    replay = write(regression_replay_report(2, 1, differences, model), tmp_path / "replay.json")
    return config, report, replay


def test_a_regression_candidate_with_doubled_error_is_rolled_back_at_the_shadow_step_and_an_identical_one_is_promoted(
    watched,  # noqa: F811
    tmp_path,
    capsys,
):
    proxy, prometheus = watched
    # Doubled error: the candidate answers truth + 2 x stable's error, so it differs from stable's answer by stable's
    # own error, beyond stable's MAE for 42 % of normal errors; replay showed 2 % (budget 4 %).
    config, report, replay = regression_site(tmp_path / "doubled", "doubled")
    doubled = proxy.add("doubled", Regression(config.parent / "routing.json", beyond=0.42))
    assert main(rollout_args(config, report, prometheus, "--replay", str(replay))) == 1
    out = capsys.readouterr().out
    assert out.startswith("rolled back: model doubled version 2: differences: differs beyond 0.8 "), out
    assert doubled.tolerances == {0.8}  # 1 x stable's MAE, carried to the proxy by the routing file
    start = next(e for e in events(config) if e["event"] == "start")
    assert start["offline"]["difference"]["count"] == 40 and start["flips"] is True
    assert [e["step"] for e in events(config) if e["event"] == "step"] == [0]  # the shadow step only
    assert labels(config) == Rollout(stable=1)

    config, report, replay = regression_site(tmp_path / "same", "same")
    proxy.add("same", Regression(config.parent / "routing.json", beyond=0.02))
    assert main(rollout_args(config, report, prometheus, "--replay", str(replay))) == 0
    looks = [e for e in events(config) if e["event"] == "check" and e["decision"] == "advance"]
    judged = {c["name"]: c["result"] for c in looks[0]["checks"]}
    assert looks[0]["step"] == 0 and judged == dict.fromkeys(["shadow_errors", "slow_copies", "differences"], "pass")
    assert labels(config) == Rollout(stable=2, previous=1)
