"""The bake on real parts: serve-local polling the config the controller rewrites, the proxy following the routing
file it writes, a real Prometheus scraping both with the repository's rules, and clients calling `stable` through
the proxy all along. A version that passes its steps and fails 10 % of the requests once it is promoted (requests
it cannot answer start arriving then) is moved back to previous within the bake, and no client call fails but
those the failing version itself failed: not at the label swap, not at its unload."""

from __future__ import annotations

import threading

import grpc
import pytest
from rollout_live import live_site, staged
from test_rollout_controller_live import POISONED, save_failing_model

from serving_fixtures import IMAGES, predict_request, stubs
from trainserve.cli import main
from trainserve.proxy.server import Proxy
from trainserve.rollout.config_file import history_path, read_config
from trainserve.rollout.history import read_history
from trainserve.rollout.labels import Rollout

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("rollout-live")]

EVERY = 10  # once the new version is stable, one request in 10 is one it cannot answer


class Clients:
    """Callers of `stable` through the proxy; once the bake's route is in force (previous named), every EVERY-th
    request is one the failing version cannot answer, from then on. Each call's (poisoned, version or error code)."""

    def __init__(self, proxy: Proxy):
        self.predict, _ = stubs(type("T", (), {"target": f"127.0.0.1:{proxy.port}"}))
        self.router, self.calls = proxy.router, []
        self.poisoning, self.stop = False, threading.Event()
        self.thread = threading.Thread(target=self._call, daemon=True)
        self.thread.start()

    def _call(self) -> None:
        clean, poisoned = (predict_request(label="stable", images=images) for images in (IMAGES, POISONED))
        sent = 0
        while not self.stop.is_set():
            route = self.router.routing.route("m")
            self.poisoning = self.poisoning or (route is not None and route.candidate == 1)
            bad = self.poisoning and sent % EVERY == 0
            try:
                answer = self.predict.Predict(poisoned if bad else clean, timeout=30)
                self.calls.append((bad, answer.model_spec.version.value))
            except grpc.RpcError as exc:
                self.calls.append((bad, exc.code().name))
            sent += 1
            self.stop.wait(0.002)  # pacing, not synchronisation

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=60)


def test_a_version_failing_10_percent_once_promoted_is_moved_back_within_the_bake_failing_no_call(
    model_versions, tmp_path, capsys
):
    failing = save_failing_model(model_versions[0], tmp_path / "failing")
    with live_site(tmp_path, {1: model_versions[0], 2: failing}) as site:
        clients = Clients(site.proxy)
        try:
            report = staged(site.config, site.base, site.server, 2)
            code = main(
                [
                    "rollout",
                    *("--config", str(site.config), "--report", str(report), "--server", site.server.target),
                    *("--routing-file", str(site.routing), "--prometheus", site.prometheus.url, "--wait", "60"),
                    *("--plan", "shadow 1s, 25% 2s, 100%", "--bake", "40s", "--interval", "0.25"),
                    # seconds-long steps: budgets some hundreds of calls show a good version within
                    *("--gate-min-requests", "10", "--gate-flip-budget-floor", "0.05"),
                    *("--gate-max-slow-increase", "0.5", "--gate-max-error-increase", "0.05"),
                ]
            )
            out = capsys.readouterr().out
            after = len(clients.calls)
            clients.stop.wait(1.0)  # calls after the rollback: the poisoned ones answered by previous
        finally:
            clients.close()
    assert code == 1 and "bake_errors" in out, out
    events = [e["event"] for e in read_history(history_path(site.config)) if e.get("action") == "rollout"]
    assert [e for e in events if e not in ("check", "notified")][-5:] == [
        *("promote", "promoted", "bake", "rollback", "rolled-back")
    ]
    assert Rollout.of(read_config(site.config).model_config_list.config[0]) == Rollout(stable=1)
    failed = [(bad, what) for bad, what in clients.calls if isinstance(what, str)]
    assert failed and all(bad for bad, _ in failed), failed  # only requests version 2 cannot answer failed
    later = clients.calls[after:]
    assert later and all(what == 1 for _, what in later), later  # previous answers every one again
