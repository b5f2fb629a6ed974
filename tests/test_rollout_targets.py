"""The proxy replicas a rollout judges, against a real Prometheus and the real controller: a rollout that nothing
scrapes the proxy for is refused before its START record (so nothing is left to --abort), and a replica under
another scrape job than --proxy-job that routes the model (a second proxy following the same routing file) refuses
the rollout, before it starts or at the look that first sees it, instead of promoting on counts without that
replica's calls. The stand-in proxies and their traffic are test_rollout_controller.py's."""

from __future__ import annotations

import time

import pytest
from test_rollout_controller import AppliedServer, StandInProxy, Traffic, events, labels, rollout_args, site

from prometheus_server import Prometheus
from trainserve.cli import build_parser, main
from trainserve.errors import TrainserveError
from trainserve.options import config_from_args
from trainserve.proxy.proxy_metrics import CANARY_PERCENT
from trainserve.proxy.routing import ModelRoute, read_routing
from trainserve.rollout.controller import Controller
from trainserve.rollout.labels import Rollout
from trainserve.rollout.moves import set_route
from trainserve.rollout.prometheus import Prometheus as PrometheusClient
from trainserve.rollout.rollout_config import RolloutConfig

pytestmark = pytest.mark.integration  # a Prometheus process, sockets

OTHER_JOB = "proxy-b"


class SecondProxy(Traffic):
    """A replica that follows the same routing file, reports the route it runs as the proxy does (its canary
    gauge), and whose canary rejects every call; silent until `appeared`."""

    appeared = False

    def lines(self) -> list[str]:
        route = read_routing(self.routing).route(self.model)
        if not self.appeared or route is None:
            return []
        gauge = f'{CANARY_PERCENT}{{model_name="{self.model}",version="{route.candidate}"}} {route.canary_percent:g}'
        return [gauge, *super().lines()]

    def _answer(self, version: int, route: str, count: float) -> None:
        if route == "canary" and count > 0:
            key = (version, "INVALID_ARGUMENT", route)
            self.requests[key] = self.requests.get(key, 0.0) + count
            return
        super()._answer(version, route, count)


@pytest.fixture(scope="module")
def two_jobs(tmp_path_factory):
    """(the proxy's stand-in, a second proxy's, a real Prometheus scraping them as jobs `proxy` and OTHER_JOB)."""
    root = tmp_path_factory.mktemp("rollout-two-jobs")
    proxies = StandInProxy(), StandInProxy()
    prometheus = Prometheus(
        root, proxies[0].target, proxy=proxies[0].target, interval="250ms", other_jobs={OTHER_JOB: proxies[1].target}
    )
    try:
        prometheus.wait_scraped(2)
        yield *proxies, prometheus
    finally:
        prometheus.stop()
        for proxy in proxies:
            proxy.stop()


def gauge_seen(prometheus: Prometheus, model: str) -> bool:
    return bool(prometheus.query(f'{CANARY_PERCENT}{{job="{OTHER_JOB}",model_name="{model}"}}'))


def test_a_replica_under_another_job_routing_the_model_refuses_the_start(two_jobs, tmp_path, capsys):
    proxy, second, prometheus = two_jobs
    config, report = site(tmp_path, "routed")
    routing = config.parent / "routing.json"
    proxy.add("routed", Traffic(routing, 1, 2))
    set_route(routing, "routed", ModelRoute(2))  # staged as `trainserve candidate --routing-file` does
    second.add("routed", SecondProxy(routing, 1, 2, appeared=True))
    prometheus.wait_for(lambda: gauge_seen(prometheus, "routed"), "the second proxy's route of the model")
    capsys.readouterr()
    assert main(rollout_args(config, report, prometheus)) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"under scrape job(s) '{OTHER_JOB}'" in line and "not --proxy-job 'proxy'" in line, line
    assert events(config) == []  # refused before the START record: nothing to --abort


def test_a_replica_under_another_job_appearing_mid_rollout_stops_it_before_a_promotion(two_jobs, tmp_path):
    proxy, second, prometheus = two_jobs
    config, report = site(tmp_path, "late")
    routing = config.parent / "routing.json"
    proxy.add("late", Traffic(routing, 1, 2))
    late = second.add("late", SecondProxy(routing, 1, 2))

    def sleep(seconds: float) -> None:  # the second proxy appears once the canary step runs, and is scraped
        route = read_routing(routing).route("late")
        if route is not None and route.canary_percent > 0 and not late.appeared:
            late.appeared = True
            prometheus.wait_for(lambda: gauge_seen(prometheus, "late"), "the second proxy's canary gauge")
        time.sleep(seconds)

    argv = rollout_args(config, report, prometheus, plan="shadow 1s, 5% 3s, 100%")
    rollout = config_from_args(RolloutConfig, build_parser().parse_args(argv))
    with pytest.raises(TrainserveError, match=f"under scrape job\\(s\\) '{OTHER_JOB}'"):
        Controller(rollout, PrometheusClient(prometheus.url), AppliedServer(), sleep=sleep).run()
    assert late.appeared and [k for k in late.requests if k[1] == "INVALID_ARGUMENT"]  # it ran a failing canary
    assert labels(config) == Rollout(stable=1, candidate=2)  # not promoted
    assert read_routing(routing).route("late").canary_percent == 0  # the route held on stable


def test_a_rollout_that_nothing_scrapes_the_proxy_for_is_refused_before_its_start(tmp_path, capsys):
    """A Prometheus without the proxy's job: refused before the START record, so `candidate` and `promote` are not
    refused afterwards as during a rollout."""
    proxy = StandInProxy()
    prometheus = Prometheus(tmp_path, proxy.target, interval="250ms")  # the serving job only
    try:
        prometheus.wait_scraped(2)
        config, report = site(tmp_path, "unscraped")
        assert main(rollout_args(config, report, prometheus)) == 2
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert "nothing scrapes the proxy" in line, line
        assert events(config) == []
        assert not (config.parent / "routing.json").exists()  # nothing written
        assert main(["promote", "--config", str(config), "--report", str(report)]) == 0  # not refused as in progress
    finally:
        prometheus.stop()
        proxy.stop()
