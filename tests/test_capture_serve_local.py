"""serve-local honours `logging_config` (TF Serving's LoggingConfig in a ModelConfig): sampled Predict calls, gRPC
and REST, become PredictionLog records whose requests, replayed, get the same bytes back from the same version;
the sample has the configured rate; a capture directory that cannot be written costs no request."""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
from scipy.stats import binomtest

from conftest import (
    DIRECT,
    MONITORING,
    QUICK_SWEEP,
    assert_one_line_error,
    free_port,
    install_version,
    predict_count,
    run_cli,
)
from trainserve.cli import main
from trainserve.model_server_config import render_model_config, single_model_config
from trainserve.protos import prediction_log_pb2
from trainserve.serving import capture
from trainserve.tfrecord import DamagedRecord, iter_records
from trainserve.traffic.metrics import DROPPED, SKIPPED, WRITTEN
from trainserve.traffic.records import prediction_log

PREDICT = "/tensorflow.serving.PredictionService/Predict"
REST_ID = {"x-request-id": "rest-9"}


def write_config(root: Path, rate: float, prefix: str) -> Path:
    """A model config serving the tiny CNN as m from `root/m`, logging `rate` of its calls under `prefix`."""
    config = single_model_config("m", str(root / "m"))
    logging = config.model_config_list.config[0].logging_config
    logging.sampling_config.sampling_rate = rate
    logging.log_collector_config.filename_prefix = prefix
    path = root / "models.config"
    path.write_text(render_model_config(config))
    return path


@pytest.fixture
def logged_m(model_versions, tmp_path, serve_in_process):
    """Start serve-local in process with m v1 logging at a rate, under a prefix (default: tmp_path/captures/m)."""
    install_version(model_versions[0], tmp_path / "m", 1)
    (tmp_path / "monitoring.config").write_text(MONITORING)

    def start(rate: float, prefix: Path | None = None, *flags: str):
        config = write_config(tmp_path, rate, str(prefix or tmp_path / "captures" / "m"))
        server = serve_in_process(
            f"--model_config_file={config}", f"--monitoring_config_file={tmp_path / 'monitoring.config'}", *flags
        )
        server.wait_available("m", 1)
        return server

    return start


def capture_counts(server) -> dict[str, int]:
    """The capture counters from the Prometheus page: written, and dropped by reason."""
    text = DIRECT.open(server.rest + "/monitoring/prometheus/metrics", timeout=10).read().decode()
    counts = {}
    for line in text.splitlines():
        if line.startswith(WRITTEN):
            counts["written"] = int(line.rsplit(" ", 1)[1])
        elif line.startswith(DROPPED):
            counts[line.split('reason="')[1].split('"')[0]] = int(line.rsplit(" ", 1)[1])
        elif line.startswith(SKIPPED):
            counts["skipped"] = int(line.rsplit(" ", 1)[1])
    return counts


def run_load(server, calls: int = 60) -> int:
    """Third-party traffic: `calls` Predicts at batch 1 and 4 from a plain TF Serving client (no trainserve origin
    header: `trainserve load` marks its calls, and a capture leaves those out); returns 0 once all are answered."""
    from serving_fixtures import predict_request, stubs

    predict, _ = stubs(server)
    for call in range(calls):
        predict.Predict(predict_request(images=np.zeros((1 + 3 * (call % 2), 8, 8, 1), np.uint8)), timeout=30)
    return 0


def read_logs(directory: Path) -> list[bytes]:
    records = []
    for path in sorted(directory.glob("*.tfrecord")):
        with open(path, "rb") as stream:
            records += list(iter_records(stream))
    return records


@pytest.mark.integration
def test_every_call_is_logged_at_rate_one_and_replays_to_the_same_bytes(logged_m, tmp_path):
    server = logged_m(1.0)
    started = time.time()
    assert run_load(server) == 0
    status, _ = server.post("/v1/models/m/versions/1:predict", {"instances": np.zeros((2, 8, 8, 1), int).tolist()})
    assert status == 200
    answered = predict_count(server)
    server.wait_for(lambda: capture_counts(server)["written"] == answered, "every call written")
    records = read_logs(tmp_path / "captures")
    assert len(records) == answered > 10

    channel = grpc.insecure_channel(server.target)
    replay = channel.unary_unary(PREDICT)  # bytes in, bytes out: nothing re-encoded on the client
    for record in records:
        log = prediction_log_pb2.PredictionLog.FromString(record)
        meta = log.log_metadata
        assert (meta.model_spec.name, meta.model_spec.version.value) == ("m", 1)
        assert meta.model_spec.signature_name == "serving_default" and meta.sampling_config.sampling_rate == 1.0
        assert int(started) <= meta.timestamp_secs <= time.time() and len(meta.request_origin) == 32
        request = log.predict_log.request.SerializeToString()
        answer = replay(request, timeout=30)
        # The record holds the answer as it crossed the wire: rebuilt around the replayed bytes, it is the record.
        assert prediction_log(meta, request, answer) == record
    channel.close()


@pytest.mark.integration
def test_trainserve_load_is_left_out_unless_told_to_be_captured(logged_m):
    server = logged_m(1.0)
    load = ["load", "--server", server.target, "--model", "m", "--batch-sizes", "1", *QUICK_SWEEP]
    assert main(load) == 0
    marked = predict_count(server)
    server.wait_for(lambda: capture_counts(server).get("skipped") == marked, "load's calls skipped")
    assert main([*load, "--mark-origin=false"]) == 0  # measuring what capture costs: recorded like any client's
    unmarked = predict_count(server) - marked
    server.wait_for(lambda: capture_counts(server)["written"] == unmarked, "the unmarked calls written")
    assert capture_counts(server)["skipped"] == marked and marked > 0 and unmarked > 0


@pytest.mark.integration
def test_a_request_id_the_client_sends_is_kept_over_grpc_and_rest(logged_m, tmp_path):
    from serving_fixtures import predict_request, stubs

    server = logged_m(1.0)
    predict, _ = stubs(server)
    predict.Predict(predict_request(), metadata=[("x-request-id", "grpc-7")], timeout=30)
    body = {"instances": np.ones((1, 8, 8, 1), int).tolist()}
    sent = urllib.request.Request(server.rest + "/v1/models/m:predict", json.dumps(body).encode(), REST_ID)
    with DIRECT.open(sent, timeout=30) as answer:
        assert answer.status == 200
    server.wait_for(lambda: capture_counts(server)["written"] == 2, "both calls written")
    logs = [prediction_log_pb2.PredictionLog.FromString(r) for r in read_logs(tmp_path / "captures")]
    assert sorted(log.log_metadata.request_origin for log in logs) == ["grpc-7", "rest-9"]
    rest = next(log for log in logs if log.log_metadata.request_origin == "rest-9")
    assert not rest.predict_log.request.model_spec.HasField("version")  # asked as the client asked: the latest
    assert list(rest.predict_log.request.inputs["images"].tensor_shape.dim) and rest.predict_log.response.outputs


@pytest.mark.integration
def test_at_rate_one_tenth_the_count_is_the_seeded_draws_and_inside_the_binomial_interval(
    logged_m, tmp_path, monkeypatch
):
    monkeypatch.setattr(capture, "new_sampler", lambda: random.Random(38).random)
    server = logged_m(0.1)
    assert run_load(server) == 0
    answered = predict_count(server)
    draws = random.Random(38)
    sampled = sum(draws.random() < 0.1 for _ in range(answered))  # each Predict draws once, in any order
    server.wait_for(lambda: capture_counts(server)["written"] == sampled, f"{sampled} calls written")
    assert len(read_logs(tmp_path / "captures")) == sampled
    assert binomtest(sampled, answered, 0.1).pvalue > 0.001, (sampled, answered)


@pytest.mark.integration
def test_a_capture_directory_that_cannot_be_written_costs_no_request(logged_m, tmp_path):
    (tmp_path / "not-a-dir").write_text("a file where the capture directory should be")
    server = logged_m(1.0, tmp_path / "not-a-dir" / "captures" / "m")
    assert run_load(server) == 0  # exit 0: no request failed
    answered = predict_count(server)
    page = DIRECT.open(server.rest + "/monitoring/prometheus/metrics", timeout=10).read().decode()
    statuses = {line.split('status="')[1].split('"')[0] for line in page.splitlines() if "request_count{" in line}
    assert statuses == {"OK"}
    server.wait_for(lambda: capture_counts(server)["write_error"] == answered, "every record dropped and counted")
    assert capture_counts(server)["written"] == 0


@pytest.mark.integration
def test_a_config_reload_applies_its_logging_config_as_tf_serving_does(logged_m, tmp_path, caplog):
    from serving_fixtures import predict_request, stubs

    server = logged_m(1.0, None, "--model_config_file_poll_wait_seconds=1")
    predict, _ = stubs(server)

    def call_and_read(directory: Path) -> list[bytes]:
        predict.Predict(predict_request(), timeout=30)
        return read_logs(directory)

    first, moved = tmp_path / "captures", tmp_path / "moved"
    server.wait_for(lambda: call_and_read(first), "a call written under the first prefix")
    write_config(tmp_path, 1.0, str(moved / "m"))
    server.wait_for(lambda: call_and_read(moved), "calls written under the new prefix once the config reloads")
    before = len(read_logs(first))  # the first prefix's writer is closed: nothing more arrives there
    server.wait_for(lambda: len(call_and_read(moved)) >= 3, "more calls under the new prefix")
    assert len(read_logs(first)) == before

    write_config(tmp_path, 1.5, str(moved / "m"))  # a broken edit: logged, the running logging kept
    server.wait_for(lambda: "model config not reloaded" in caplog.text, "the broken edit refused")
    written = len(read_logs(moved))
    server.wait_for(lambda: len(call_and_read(moved)) > written, "calls still written under the new prefix")

    write_config(tmp_path, 0.0, str(moved / "m"))  # rate 0: nothing logged, the capture counters gone
    server.wait_for(lambda: capture_counts(server) == {}, "logging turned off by the reload")
    predict.Predict(predict_request(), metadata=[("x-request-id", "after-off")], timeout=30)
    assert server.stop() == 0  # every writer closed: what is on disk now is all there will be
    origins = [prediction_log_pb2.PredictionLog.FromString(r).log_metadata.request_origin for r in read_logs(moved)]
    assert len(origins) >= 3 and "after-off" not in origins


@pytest.mark.integration
@pytest.mark.parametrize(
    "rate, prefix, fragment",
    [(1.5, "captures/m", "sampling_rate 1.5"), (0.5, "", "filename_prefix ''"), (0.5, "captures/", "filename_prefix")],
    ids=["rate-above-one", "no-prefix", "prefix-is-a-directory"],
)
def test_bad_logging_config_fails_in_one_line_before_serving(tmp_path, rate, prefix, fragment):
    config = write_config(tmp_path, rate, prefix)
    ports = (f"--port={free_port()}", f"--rest_api_port={free_port()}")
    proc = run_cli("serve-local", f"--model_config_file={config}", *ports, cwd=tmp_path, timeout=120)
    assert_one_line_error(proc, "logging_config", fragment)


@pytest.mark.integration
def test_sigkill_while_logging_leaves_readable_files(model_versions, tmp_path, serve_local):
    from serving_fixtures import predict_request

    install_version(model_versions[0], tmp_path / "m", 1)
    server = serve_local(f"--model_config_file={write_config(tmp_path, 1.0, str(tmp_path / 'captures' / 'm'))}")
    server.wait_available("m", 1)
    stop = threading.Event()
    request = predict_request().SerializeToString()

    def send() -> None:  # calls keep coming while the server dies
        with grpc.insecure_channel(server.target) as channel:
            call = channel.unary_unary(PREDICT)
            while not stop.is_set():
                with contextlib.suppress(grpc.RpcError):
                    call(request, timeout=10)

    senders = [threading.Thread(target=send) for _ in range(2)]
    for thread in senders:
        thread.start()
    try:
        server.wait_for(lambda: sum(p.stat().st_size for p in tmp_path.glob("captures/*")) > 200_000, "records")
        server.proc.kill()
        server.proc.wait()
    finally:
        stop.set()
        for thread in senders:
            thread.join()
    kept, damaged = [], []
    for path in sorted((tmp_path / "captures").glob("*.tfrecord")):
        with open(path, "rb") as stream:
            try:
                kept.extend(iter_records(stream))
            except DamagedRecord as damage:  # only the record being written when the process died: the file's tail
                damaged.append((path, damage.offset))
    assert len(damaged) <= 1 and len(kept) > 10, damaged
    if damaged:
        path, offset = damaged[0]
        assert path.stat().st_size - offset < 10_000, "the damage is in the last record, not before it"
    logs = [prediction_log_pb2.PredictionLog.FromString(r) for r in kept]
    assert {log.log_metadata.model_spec.version.value for log in logs} == {1}
