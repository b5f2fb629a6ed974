"""`trainserve rollout` at a shadow step whose copies are shed, with the real controller and a real Prometheus
(test_rollout_controller's stand-in proxy): a candidate flipping 72 % of its pairs, half its copies shed, is
rolled back, not paused; one whose copies are 11x slower than stable's calls is rolled back at the shadow step."""

from __future__ import annotations

import math

import pytest
from test_rollout_controller import (
    LATENCY_BUCKETS,
    Traffic,
    events,
    labels,
    rollout_args,
    site,
    watched,  # noqa: F401 (the fixture)
)

from trainserve.cli import main
from trainserve.rollout.labels import Rollout

pytestmark = pytest.mark.integration  # a Prometheus process, sockets


class ShedTraffic(Traffic):
    """Traffic whose copies are `shed_share` shed, the rest compared and answered in `copy_micros` each."""

    def __init__(self, *args, shed_share: float = 0.5, copy_micros: float = 1000.0, **behaviour):
        super().__init__(*args, **behaviour)
        self.shed_share, self.copy_micros, self.shed = shed_share, copy_micros, 0.0

    def tick(self) -> None:
        before = self.shadow["compared"]
        super().tick()
        shed = (self.shadow["compared"] - before) * self.shed_share  # never sent, so never compared
        self.shed += shed
        self.shadow["compared"] -= shed
        self.shadow["pairs"] -= 8 * shed
        self.shadow["flips"] -= 8 * shed * self.flip_share

    def lines(self) -> list[str]:
        cand = f'model_name="{self.model}",version="{self.candidate}"'
        compared = math.floor(self.shadow["compared"])
        out = [f':trainserve:proxy:shadow_requests{{{cand},outcome="shed"}} {math.floor(self.shed)}']
        for bound in (*LATENCY_BUCKETS, math.inf):
            le = "+Inf" if bound == math.inf else f"{bound:g}"
            out.append(
                f':trainserve:proxy:shadow_latency_bucket{{{cand},le="{le}"}} '
                f"{compared if self.copy_micros <= bound else 0}"
            )
        out.append(f":trainserve:proxy:shadow_latency_count{{{cand}}} {compared}")
        return [*super().lines(), *out]


def test_a_candidate_flipping_72_percent_with_half_its_copies_shed_is_rolled_back_not_paused(watched, tmp_path, capsys):  # noqa: F811
    proxy, prometheus = watched
    config, report = site(tmp_path, "flipshed")
    traffic = ShedTraffic(config.parent / "routing.json", 1, 2, flip_share=0.72, shed_share=0.57)
    proxy.add("flipshed", traffic)
    assert main(rollout_args(config, report, prometheus, "--max-hold", "5")) == 1
    out = capsys.readouterr().out
    assert "flip_rate: flips" in out and "counted as" in out and "pairs without a flip" in out, out
    assert [e["step"] for e in events(config) if e["event"] == "step"] == [0]
    assert not [k for k in traffic.requests if k[2] == "canary"]  # no client ever got its answer
    assert labels(config) == Rollout(stable=1)


def test_a_candidate_whose_copies_are_11x_slower_is_rolled_back_at_the_shadow_step(watched, tmp_path, capsys):  # noqa: F811
    proxy, prometheus = watched
    config, report = site(tmp_path, "slowshed")
    traffic = ShedTraffic(config.parent / "routing.json", 1, 2, flip_share=0.0, shed_share=0.46, copy_micros=11_000)
    proxy.add("slowshed", traffic)
    assert main(rollout_args(config, report, prometheus, "--max-hold", "5")) == 1
    assert "slow_copies: shadow copies above stable's p99" in capsys.readouterr().out
    assert [e["step"] for e in events(config) if e["event"] == "step"] == [0]
    assert not [k for k in traffic.requests if k[2] == "canary"]
    assert labels(config) == Rollout(stable=1)
