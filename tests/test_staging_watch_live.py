"""Staging that does not hurt stable, on real parts: serve-local polling the config `trainserve candidate` rewrites,
the proxy in front of it, a real Prometheus scraping the proxy, and clients calling `stable` through the proxy at a
steady rate. A version whose warmup burns the server's CPU (tensorflow/serving#1866: a load slows the versions
served beside it) is refused with the damage stated and unloaded; a light one is staged."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import numpy as np
import pytest
from rollout_live import live_site

from serving_fixtures import IMAGES, predict_request, stubs
from trainserve.cli import main
from trainserve.proxy.server import Proxy
from trainserve.rollout.config_file import history_path, read_config
from trainserve.rollout.history import read_history
from trainserve.rollout.labels import Rollout

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("rollout-live")]
BURN_STEPS = 60  # iterations of a 1024 x 1024 matmul per warmup record: seconds of every core on this machine
BURN_RECORDS = 3


def save_heavy_warmup_model(template: Path, path: Path) -> Path:
    """`template`'s serving signature, plus a `burn` signature (a tf.while_loop of matmuls) that its warmup
    requests call: loading it keeps the server's thread pools busy for seconds, as a large model's warmup does."""
    import tensorflow as tf

    from trainserve.layout import warmup_path, write_warmup_requests
    from trainserve.protos import prediction_log_pb2
    from trainserve.tensors import to_tensor_proto

    loaded = tf.saved_model.load(str(template))
    inner = loaded.signatures["serving_default"]

    class Heavy(tf.Module):
        def __init__(self):
            super().__init__()
            self.loaded = loaded

        @tf.function(input_signature=[inner.structured_input_signature[1]["images"]], autograph=False)
        def serve(self, images):
            return inner(images=images)

        @tf.function(input_signature=[tf.TensorSpec([], tf.int32)], autograph=False)
        def burn(self, steps):
            m = tf.random.stateless_uniform([1024, 1024], seed=[1, 2]) / 1024.0
            out = tf.while_loop(lambda i, a: i < steps, lambda i, a: (i + 1, tf.tanh(a @ m)), [0, m])[1]
            return {"checksum": tf.reduce_sum(out)}

    module = Heavy()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve, "burn": module.burn})
    write_warmup_requests(path, "m", {"images": np.asarray(IMAGES)})
    with tf.io.TFRecordWriter(str(warmup_path(path))) as writer:
        for _ in range(BURN_RECORDS):
            log = prediction_log_pb2.PredictionLog()
            request = log.predict_log.request
            request.model_spec.name, request.model_spec.signature_name = "m", "burn"
            to_tensor_proto(np.array(BURN_STEPS, np.int32), into=request.inputs["steps"])
            writer.write(log.SerializeToString())
    return path


class Callers:
    """Clients calling `stable` through the proxy, one call every 10 ms; every failed call's code kept."""

    def __init__(self, proxy: Proxy):
        self.predict, _ = stubs(type("T", (), {"target": f"127.0.0.1:{proxy.port}"}))
        self.calls, self.errors, self.stop = 0, [], threading.Event()
        self.thread = threading.Thread(target=self._call, daemon=True)
        self.thread.start()

    def _call(self) -> None:
        request = predict_request(label="stable")
        while not self.stop.is_set():
            try:
                self.predict.Predict(request, timeout=30)
            except grpc.RpcError as exc:
                self.errors.append(exc.code().name)
            self.calls += 1
            self.stop.wait(0.01)  # pacing, not synchronisation

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=60)


@pytest.fixture(scope="module")
def live(model_versions, tmp_path_factory):
    """Model m: version 1 stable, 2 with a heavy warmup, 3 a light one; clients calling stable all along, and
    Prometheus holding some seconds of stable's calls (its p99 before any load)."""
    root = tmp_path_factory.mktemp("staging-live")
    heavy = save_heavy_warmup_model(model_versions[0], root / "heavy")
    with live_site(root, {1: model_versions[0], 2: heavy, 3: model_versions[1]}) as site:
        callers = Callers(site.proxy)
        try:
            calls = ':trainserve:proxy:request_latency_count{job="proxy",version="1"}'
            site.prometheus.wait_for(
                lambda: [float(s["value"][1]) > 800 for s in site.prometheus.query(calls)] == [True],
                "800 of stable's calls scraped: its p99 before any load, past serve-local's first calls",
            )
            yield site, callers
        finally:
            callers.close()


def candidate(site, version: int) -> int:
    return main(
        [
            "candidate",
            *("--config", str(site.config), "--version", str(version), "--server", site.server.target),
            *("--wait", "60", "--prometheus", site.prometheus.url, "--stage-baseline", "6s"),
            *("--stage-min-calls", "50"),  # and the default budgets: +5 points slow, +1 point failed
        ]
    )


def test_a_version_whose_warmup_slows_stable_is_refused_and_unloaded_and_a_light_one_staged(live, capsys):
    site, callers = live
    assert candidate(site, 2) == 2
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert "staging version 2 slowed stable: " in said and said.endswith("; unloaded"), said
    assert site.server.versions("m").get(2, "END") == "END"  # waited out of the server before the refusal
    assert Rollout.of(read_config(site.config).model_config_list.config[0]) == Rollout(1)
    refusal = read_history(history_path(site.config))[-1]
    assert refusal["refused"] in said and refusal["staging"]["slow"]["hurt"], refusal
    assert refusal["staging"]["load_seconds"] > 1

    assert candidate(site, 3) == 0
    staged = read_history(history_path(site.config))[-1]
    assert staged["after"] == {"stable": 1, "candidate": 3} and staged["staging"]["judged"], staged
    assert not callers.errors  # the refused load slowed stable's callers; none of their calls failed
