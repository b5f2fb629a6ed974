"""Staging that does not hurt stable, on real parts: serve-local polling the config `trainserve candidate` rewrites,
the proxy in front of it, a real Prometheus scraping the proxy, and clients calling `stable` through the proxy at a
steady rate. A light version is staged; a version whose warmup records take a second or more each is refused with
the damage stated and unloaded.

The damage is planted so that it does not depend on how busy the machine is. serve-local batches with one batch
thread, and a version loaded while others serve replays its warmup on the batch threads, as TF Serving replays it
through its batching session: stable's batches wait behind each record, whatever else the machine runs. (Damage
through the CPU alone shrinks as the machine gets busier: a heavy warmup that only burned the cores slowed 21 % of
stable's calls past its p99 on an idle machine and 3 % beside a running test suite.)"""

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
BURN_STEPS = 30  # 1024 x 1024 matmuls per heavy warmup record: about a second on an idle 2-core machine,
BURN_SECONDS = 1.0  # and at least this long on a faster one
BURN_RECORDS = 3
# One batch thread shared by every version (TF Serving's shared batch scheduler); queues deep enough that a
# caller waiting behind a warmup record is answered late, never refused.
BATCHING = "max_batch_size { value: 128 }\nbatch_timeout_micros { value: 0 }\nnum_batch_threads { value: 1 }\n"
BATCHING += "max_enqueued_batches { value: 100000 }\n"
# A light load's own work shows too where serve-local, the proxy and the callers share one interpreter (reading the
# SavedModel and its warmup file holds the GIL): 0-34 % of stable's calls above its p99 on a 2-core machine, idle to
# oversubscribed 7 times, its increase's lower bound at most +18 points. The planted warmup: 55-93 %, at least +43.
# The budget sits between, out of either's reach.
SLOW_BUDGET = 0.3
BASELINE_SECONDS = 6


def save_heavy_warmup_model(template: Path, path: Path) -> Path:
    """`template`'s serving signature, plus a `burn` signature (a tf.while_loop of matmuls, one row a call) that
    its warmup requests call: each record holds a batch thread for a second or more, as a large model's does."""
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

        @tf.function(input_signature=[tf.TensorSpec([None], tf.int32)], autograph=False)
        def burn(self, steps):
            m, start = tf.random.stateless_uniform([1024, 1024], seed=[1, 2]) / 1024.0, tf.timestamp()
            more = lambda i, a: tf.logical_or(i < steps[0], tf.timestamp() - start < BURN_SECONDS)  # noqa: E731
            out = tf.while_loop(more, lambda i, a: (i + 1, tf.tanh(a @ m)), [0, m])[1]
            return {"checksum": tf.fill(tf.shape(steps), tf.reduce_sum(out))}  # one row a row: batchable

    module = Heavy()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve, "burn": module.burn})
    write_warmup_requests(path, "m", {"images": np.asarray(IMAGES)})
    with tf.io.TFRecordWriter(str(warmup_path(path))) as writer:
        for _ in range(BURN_RECORDS):
            log = prediction_log_pb2.PredictionLog()
            request = log.predict_log.request
            request.model_spec.name, request.model_spec.signature_name = "m", "burn"
            to_tensor_proto(np.array([BURN_STEPS], np.int32), into=request.inputs["steps"])
            writer.write(log.SerializeToString())
    return path


class Callers:
    """Clients calling `stable` through the proxy, a call every 10 ms whether or not the earlier ones were
    answered (independent users: a stalled call holds none back); every failed call's code kept."""

    def __init__(self, proxy: Proxy):
        self.predict, _ = stubs(type("T", (), {"target": f"127.0.0.1:{proxy.port}"}))
        self.calls, self.errors, self.stop = 0, [], threading.Event()
        self.thread = threading.Thread(target=self._call, daemon=True)
        self.thread.start()

    def _call(self) -> None:
        request = predict_request(label="stable")
        while not self.stop.wait(0.01):  # pacing, not synchronisation
            self.predict.Predict.future(request, timeout=120).add_done_callback(self._answered)
            self.calls += 1

    def _answered(self, call: grpc.Future) -> None:
        if call.code() != grpc.StatusCode.OK:
            self.errors.append(call.code().name)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=60)


@pytest.fixture(scope="module")
def live(model_versions, tmp_path_factory):
    """Model m: version 1 stable, 2 a light one, 3 with a heavy warmup; clients calling stable all along, and
    Prometheus holding some seconds of stable's calls (its p99 before any load)."""
    root = tmp_path_factory.mktemp("staging-live")
    heavy = save_heavy_warmup_model(model_versions[0], root / "heavy")
    (root / "batching.config").write_text(BATCHING)
    flags = ("--enable_batching", f"--batching_parameters_file={root / 'batching.config'}")
    with live_site(root, {1: model_versions[0], 2: model_versions[1], 3: heavy}, *flags) as site:
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
            *("--wait", "120", "--prometheus", site.prometheus.url, "--stage-baseline", f"{BASELINE_SECONDS}s"),
            *("--stage-min-calls", "50", "--stage-max-slow-increase", str(SLOW_BUDGET)),  # errors: +1 point
        ]
    )


def past_the_baseline(site) -> None:
    """Until Prometheus has scraped the proxy for a baseline's length since now: the next load's p99 and shares
    are read over calls the load before did not touch."""
    since = float(site.prometheus.query("vector(time())")[0]["value"][1])
    scraped = 'timestamp(up{job="proxy"})'
    site.prometheus.wait_for(
        lambda: [float(s["value"][1]) >= since + BASELINE_SECONDS for s in site.prometheus.query(scraped)] == [True],
        "a baseline's length of stable's calls scraped since the light version's load",
    )


def test_a_light_version_is_staged_and_one_whose_warmup_holds_stables_batches_is_refused_and_unloaded(live, capsys):
    site, callers = live
    assert candidate(site, 2) == 0
    staged = read_history(history_path(site.config))[-1]
    assert staged["after"] == {"stable": 1, "candidate": 2} and staged["staging"]["judged"], staged
    assert not staged["staging"]["slow"]["hurt"] and not staged["staging"]["errors"]["hurt"], staged

    past_the_baseline(site)

    assert candidate(site, 3) == 2
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert "staging version 3 slowed stable: " in said and said.endswith("; unloaded"), said
    assert site.server.versions("m").get(3, "END") == "END"  # waited out of the server before the refusal
    assert Rollout.of(read_config(site.config).model_config_list.config[0]) == Rollout(1, candidate=2)
    refusal = read_history(history_path(site.config))[-1]
    assert refusal["refused"] in said and refusal["staging"]["slow"]["hurt"], refusal
    assert refusal["staging"]["load_seconds"] > 1
    assert not callers.errors  # the refused load slowed stable's callers; none of their calls failed
