"""The plan `auto` on real parts (tests/rollout_live.py: serve-local, the proxy, a real Prometheus): clients call
`stable` through the proxy at a steady 14 requests/s; `trainserve rollout --dry-run` reads that rate from
Prometheus, which has minutes of it (the last hour's rate, over the part of the hour it saw), and states the plan
and what it should take; the same rollout run for real follows that plan, is promoted within the stated "at most",
and no client call fails."""

from __future__ import annotations

import logging
import re
import threading
import time

import grpc
import pytest
from rollout_live import live_site, staged

from serving_fixtures import IMAGES, predict_request, stubs
from trainserve.cli import main
from trainserve.proxy.server import Proxy
from trainserve.rollout.config_file import history_path
from trainserve.rollout.history import read_history
from trainserve.rollout.sizing.choose import hours
from trainserve.rollout.sizing.traffic import seen_query

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("rollout-live")]

RATE = 14.0  # the clients' requests per second: about 10, and no test over a minute
# Seconds of calls Prometheus has seen before the dry run. The rate read then is over by at most a scrape's worth of
# calls (up to RATE * 1 s / SEEN), and the plan is sized on the rate to two figures: 14 reads 14 from 30 s seen on,
# so the dry run and the start size the same plan (at 20 requests/s, 20.7 read 21 at one and 20 at the other).
SEEN = 30
# At the default budgets (errors and slow calls at most 1 point above stable's, 200 calls a check) `auto` sizes a
# plan of about 30 minutes at 10 requests/s: too long for a test. Only what sizes the samples is loosened (15-point
# budgets, 30 calls a check), and the plan is to decide as quickly as it can (a target of 40 s), looked at every
# 2 s, within 15 minutes: promoted in about 50 s.
SAMPLES = ("--gate-max-error-increase", "0.15", "--gate-max-slow-increase", "0.15", "--gate-min-requests", "30")
LIMITS = ("--max-duration", "15m", "--target-duration", "40s", "--interval", "2")
TRAFFIC = re.compile(r"  at ([0-9.e+]+) requests/s \((.+?)\), stable's error share ")
MOST = re.compile(r"; at most (.+) before a step would pause$")


class PacedClients:
    """A caller of `stable` through the proxy at `rate` requests per second on a monotonic schedule (a call that
    is due is made at once, so that the rate holds on average), each answer's version or error code kept."""

    def __init__(self, proxy: Proxy, rate: float):
        self.predict, _ = stubs(type("T", (), {"target": f"127.0.0.1:{proxy.port}"}))
        self.rate, self.answers, self.errors = rate, [], []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._call, daemon=True)
        self.thread.start()

    def _call(self) -> None:
        request = predict_request(label="stable", images=IMAGES)
        began, sent = time.monotonic(), 0
        while not self.stop.wait(max(0.0, began + sent / self.rate - time.monotonic())):
            try:
                self.answers.append(self.predict.Predict(request, timeout=30).model_spec.version.value)
            except grpc.RpcError as exc:
                self.errors.append(exc.code().name)
            sent += 1

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=60)


@pytest.fixture(scope="module")
def paced(model_versions, tmp_path_factory):
    """Model m: version 1 stable, version 2 a retrain with the same weights (its answers flip on none) staged, with
    its eval report; clients at RATE requests/s from the start, SEEN seconds of them in Prometheus."""
    root = tmp_path_factory.mktemp("rollout-auto")
    with live_site(root, {1: model_versions[0], 2: model_versions[0]}) as site:
        clients = PacedClients(site.proxy, RATE)
        try:
            report = staged(site.config, site.base, site.server, 2)
            site.prometheus.wait_for(lambda: seen(site.prometheus) >= SEEN, f"{SEEN} s of the clients' calls seen")
            yield site, clients, report
        finally:
            clients.close()


@pytest.fixture(scope="module")
def argv(paced) -> list[str]:
    site, _, report = paced
    return [
        *("rollout", "--config", str(site.config), "--report", str(report), "--server", site.server.target),
        *("--routing-file", str(site.routing), "--prometheus", site.prometheus.url, "--wait", "60"),
        *SAMPLES,
        *LIMITS,
    ]


@pytest.fixture(scope="module")
def dry_run(argv) -> list[str]:
    """What the dry run printed of the plan (it sizes the plan: seconds of simulation)."""
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert main([*argv, "--dry-run"]) == 0
    return plan_lines(out.getvalue())


def plan_lines(out: str) -> list[str]:
    """What the dry run says of the plan and its durations: its `plan ...` line and the indented lines under it."""
    lines = out.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("plan "))
    end = next((i for i in range(first + 1, len(lines)) if not lines[i].startswith("  ")), len(lines))
    return lines[first:end]


def seen(prometheus) -> float:
    """Seconds since Prometheus first saw a call of model m (0 before)."""
    return max((float(s["value"][1]) for s in prometheus.query(seen_query("m", "proxy"))), default=0.0)


def test_the_dry_run_reads_the_clients_rate_and_states_the_plan(dry_run):
    assert dry_run[0].startswith("plan auto: shadow"), dry_run
    rate, source = TRAFFIC.match(dry_run[1]).groups()
    assert source == "the last hour" and abs(float(rate) - RATE) <= 0.3 * RATE, dry_run[1]
    assert len([line for line in dry_run if MOST.search(line)]) == 1, dry_run


def test_the_rollout_follows_the_plan_stated_and_is_promoted_within_its_most(paced, argv, dry_run, capsys, caplog):
    site, clients, _ = paced
    (most,) = [m.group(1) for m in map(MOST.search, dry_run) if m]
    caplog.set_level(logging.INFO, logger="trainserve.rollout.controller")
    began = time.monotonic()
    code = main(argv)
    took = time.monotonic() - began
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("promoted: model m: stable -> 2, previous -> 1"), out

    history = [e for e in read_history(history_path(site.config)) if e.get("action") == "rollout"]
    start = next(e for e in history if e["event"] == "start")
    assert "plan auto: " + start["plan"] == dry_run[0]
    source = TRAFFIC.match(dry_run[1]).group(2)
    assert start["sizing"]["source"] == source and hours(start["sizing"]["most_seconds"]) == most
    logged = [r.getMessage() for r in caplog.records if r.name == "trainserve.rollout.controller"]
    expected = [f"model m: {line}" for line in dry_run]  # the controller logs at its start what the dry run printed
    assert expected[0] in logged, logged[:5]
    assert logged[logged.index(expected[0]) :][: len(expected)] == expected
    # the bound the dry run stated held for the whole run (staging aside: the candidate was staged before)
    assert took <= start["sizing"]["most_seconds"], (took, start["sizing"])

    clients.close()
    assert not clients.errors, clients.errors[:5]
    assert set(clients.answers) == {1, 2}  # stable, and the candidate once it had a share or was promoted
