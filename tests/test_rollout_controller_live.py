"""`trainserve rollout` end to end on real parts: serve-local polling the config the controller rewrites, the
proxy following the routing file it writes, a real Prometheus scraping the proxy with the repository's
rules, and clients calling `stable` through the proxy all along. A candidate whose answers flip is stopped at the
shadow step before any client gets its answer; a good one goes shadow -> 5 % -> 25 % -> 100 % and is promoted;
no client call fails, and none is answered by a version the routing file did not name."""

from __future__ import annotations

import re
import shutil
import threading
from pathlib import Path

import grpc
import pytest
from rollout_live import live_site, staged
from scipy.stats import binom

from serving_fixtures import IMAGES, predict_request, stubs
from trainserve.cli import main
from trainserve.proxy.routing import read_routing
from trainserve.proxy.server import Proxy
from trainserve.rollout.config_file import history_path, read_config
from trainserve.rollout.history import read_history
from trainserve.rollout.labels import Rollout

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("rollout-live")]


POISONED = IMAGES.copy()
POISONED[0, 0, 0, 0] = 255  # a request the failing version cannot answer (stable can)


def save_failing_model(template: Path, path: Path) -> Path:
    """`template`'s answers, except for a batch whose first image's top-left pixel is 255: then the model reads a
    directory as a file and fails with TensorFlow's error, which serving passes on (a server error, not the
    client's)."""
    import tensorflow as tf

    loaded = tf.saved_model.load(str(template))
    inner = loaded.signatures["serving_default"]

    class Failing(tf.Module):
        def __init__(self):
            super().__init__()
            self.loaded = loaded

        @tf.function(input_signature=[inner.structured_input_signature[1]["images"]])
        def serve(self, images):
            poisoned = tf.equal(images[0, 0, 0, 0], 255)
            read = tf.cond(poisoned, lambda: tf.strings.length(tf.io.read_file("/")), lambda: tf.constant(0))
            with tf.control_dependencies([read]):
                return inner(images=tf.identity(images))

    module = Failing()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    shutil.copytree(template / "assets.extra", path / "assets.extra")  # warmed up at load, as its template
    return path


FULL = "shadow 1s, 5% 1s, 25% 1s, 100%"


class Clients:
    """Callers of `stable` through the proxy (every third request one the failing version cannot answer), each
    answer's version (or error code) recorded with the canary share the proxy ran when the call began (the routing
    file's, once the proxy has read it: a change reaches it one poll later)."""

    def __init__(self, proxy: Proxy):
        self.predict, _ = stubs(type("T", (), {"target": f"127.0.0.1:{proxy.port}"}))
        self.router, self.answers, self.errors = proxy.router, [], []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._call, daemon=True)
        self.thread.start()

    def _call(self) -> None:
        requests = [predict_request(label="stable", images=images) for images in (IMAGES, IMAGES, POISONED)]
        sent = 0
        while not self.stop.is_set():
            route = self.router.routing.route("m")
            share = route.canary_percent if route else 0.0
            named = {route.candidate} if route and share > 0 else set()
            try:
                answer = self.predict.Predict(requests[sent % 3], timeout=30)
                self.answers.append((answer.model_spec.version.value, named, share))
            except grpc.RpcError as exc:
                self.errors.append((exc.code().name, named, share))
            sent += 1
            self.stop.wait(0.002)  # pacing, not synchronisation

    def calls_at(self, share: float) -> int:
        return sum(1 for *_, s in self.answers + self.errors if s == share)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=60)


@pytest.fixture(scope="module")
def live(model_versions, tmp_path_factory):
    """Model m: version 1 stable; 2 the same weights (no flips), 3 other weights, 4 failing on some requests;
    serve-local, proxy, Prometheus, and clients calling `stable` through the proxy."""
    root = tmp_path_factory.mktemp("rollout-live")
    failing = save_failing_model(model_versions[0], root / "failing")
    versions = {1: model_versions[0], 2: model_versions[0], 3: model_versions[1], 4: failing}
    with live_site(root, versions) as site:
        clients = Clients(site.proxy)
        try:
            yield site.config, site.base, site.server, site.prometheus, clients
        finally:
            clients.close()


def roll_out(config, base, server, prometheus, version: int, plan: str = FULL, slow: str = "0.5") -> int:
    """Stage `version` on the real server, then run the whole plan against it."""
    report = staged(config, base, server, version)
    return main(
        [
            "rollout",
            *("--config", str(config), "--report", str(report), "--server", server.target, "--wait", "60"),
            *("--routing-file", str(config.parent / "routing.json"), "--prometheus", prometheus.url),
            *("--plan", plan, "--interval", "0.25", "--gate-min-requests", "10"),
            # seconds-long steps: budgets wide enough for some tens of calls to show a good candidate within them
            *("--gate-flip-budget-floor", "0.05", "--gate-max-slow-increase", slow, "--gate-max-error-increase", "0.1"),
        ]
    )


def test_a_flipping_candidate_stops_at_the_shadow_step_and_a_good_one_is_promoted(live, capsys):
    config, base, server, prometheus, clients = live

    code, out = roll_out(config, base, server, prometheus, 3), capsys.readouterr().out
    # its flips overall, or those within one class of stable's answers, whichever the looks showed first
    assert code == 1 and re.search(r"rolled back: model m version 3: flip_(rate|classes): ", out), out
    events = [e for e in read_history(history_path(config)) if e.get("action") == "rollout"]
    assert [e["step"] for e in events if e["event"] == "step"] == [0]  # the shadow step only
    assert Rollout.of(read_config(config).model_config_list.config[0]) == Rollout(stable=1)
    assert 3 not in {version for version, *_ in clients.answers}  # no client ever got its answer

    code, out = roll_out(config, base, server, prometheus, 2), capsys.readouterr().out
    assert code == 0 and out.startswith("promoted: model m: stable -> 2, previous -> 1"), out
    events = [e for e in read_history(history_path(config)) if e.get("action") == "rollout"]
    assert [e["step"] for e in events if e["event"] == "step"][-3:] == [0, 1, 2]
    assert read_routing(config.parent / "routing.json").route("m") is None
    server.wait_for(lambda: server.versions("m").get(3) in (None, "END"), "version 3 unloaded")

    assert not clients.errors, clients.errors[:5]
    # every answer came from stable (1, then 2 once promoted) or from a candidate the routing gave a share
    strays = [(v, named) for v, named, _ in clients.answers if v not in {1, 2} and v not in named]
    assert not strays, strays[:5]
    assert any(v == 2 and named == {2} for v, named, _ in clients.answers), "no client got the canary's answer"


def test_a_candidate_failing_requests_is_rolled_back_at_its_first_canary_step(live, capsys):
    """Without a shadow step (which would stop it before any client saw it), at 5 %: clients see errors only on
    the canary's share, never beyond it."""
    config, base, server, prometheus, clients = live
    stable = Rollout.of(read_config(config).model_config_list.config[0]).stable
    # judged on its errors alone: a p99 over a second's few canary calls is too coarse to be this test's subject
    assert roll_out(config, base, server, prometheus, 4, plan="5% 1s, 25% 1s, 100%", slow="1") == 1
    out = capsys.readouterr().out
    assert out.startswith("rolled back: model m version 4: error_ratio: error share"), out
    events = [e for e in read_history(history_path(config)) if e.get("action") == "rollout"]
    assert [e["step"] for e in events if e["event"] == "step"][-1:] == [0] and events[-1]["event"] == "rolled-back"
    assert Rollout.of(read_config(config).model_config_list.config[0]).stable == stable  # untouched
    assert read_routing(config.parent / "routing.json").route("m") is None
    clients.close()
    assert clients.errors, "no client call failed: the canary never answered a failing request"
    assert all(named == {4} and share == 5 for _, named, share in clients.errors), clients.errors[:5]
    # at most the canary's share of the calls made while it had one (a one-sided 1e-4 binomial bound)
    assert len(clients.errors) <= binom.ppf(1 - 1e-4, clients.calls_at(5), 0.05)
