"""Request batching: the scheduler alone (a fake model), then serve-local with `--enable_batching` as clients
see it: in process (serve() on a thread, real gRPC), and as a process for what needs SIGTERM."""

from __future__ import annotations

import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest

from conftest import DIRECT, MONITORING, install_version, save_foreign_model
from serving_fixtures import predict_request, stubs
from trainserve.savedmodel import LoadedModel
from trainserve.serving.batching import BatchScheduler, QueueFull, padded_size, split, task_size
from trainserve.serving.config import Batching
from trainserve.tensors import from_tensor_proto


def doubling_run(calls: list, gate: threading.Event | None = None):
    """A fake model: records each batch's rows, waits for `gate`, answers 2x and a per-row sum."""

    def run(inputs):
        calls.append(len(inputs["x"]))
        if gate is not None:
            gate.wait(10)
        return {"double": inputs["x"] * 2, "total": inputs["x"].sum(axis=1)}

    return run


@pytest.mark.unit
def test_task_size_and_padding_rules():
    assert task_size({"a": np.zeros((3, 2)), "b": np.zeros(3)}) == 3
    assert task_size({"a": np.zeros((3, 2)), "b": np.zeros(2)}) is None, "first dimensions differ: runs alone"
    assert task_size({"a": np.zeros(())}) is None and task_size({"a": np.zeros((0, 2))}) is None
    assert [padded_size(n, (2, 4, 8)) for n in (1, 2, 3, 5, 8)] == [2, 2, 4, 8, 8]
    assert padded_size(5, ()) == 5
    assert split({"scalar": np.float32(1)}, [1, 1], 2) is None


@pytest.mark.unit
def test_concurrent_tasks_are_merged_and_each_gets_its_own_rows():
    calls, gate = [], threading.Event()
    scheduler = BatchScheduler(Batching(max_batch_size=64, num_batch_threads=1), None)
    rows = [np.full((1 + i % 3, 2), i, np.float32) for i in range(20)]
    with ThreadPoolExecutor(20) as pool:
        results = [pool.submit(scheduler.submit, "k", doubling_run(calls, gate), {"x": x}, len(x)) for x in rows]
        time.sleep(0.3)  # the first batch holds the only thread; the rest queue up behind it
        gate.set()
        answers = [r.result(timeout=10) for r in results]
    scheduler.close()
    for x, answer in zip(rows, answers):
        np.testing.assert_array_equal(answer["double"], x * 2)
        np.testing.assert_array_equal(answer["total"], x.sum(axis=1))
    assert len(calls) < len(rows) and max(calls) > 3, f"batches run: {calls}"


@pytest.mark.unit
def test_padding_is_stripped_and_unsplittable_outputs_run_alone():
    calls, recorded = [], []
    options = Batching(max_batch_size=8, allowed_batch_sizes=(4, 8), num_batch_threads=1)
    scheduler = BatchScheduler(options, lambda sizes, processed: recorded.append((sizes, processed)))
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    answer = scheduler.submit("k", doubling_run(calls), {"x": x}, 3)
    np.testing.assert_array_equal(answer["double"], x * 2)  # 3 rows back, not the 4 run
    assert calls == [4] and recorded == [([3], 4)]

    def scalar_run(inputs):
        return {"sum": inputs["x"].sum()}

    answer = scheduler.submit("s", scalar_run, {"x": x}, 3)
    assert answer["sum"] == x.sum(), "padded run cannot be split: the task ran again alone"
    scheduler.close()


@pytest.mark.unit
def test_a_full_queue_refuses_and_close_drains_what_is_queued():
    calls = []
    options = Batching(max_batch_size=2, batch_timeout_micros=60_000_000, max_enqueued_batches=1, num_batch_threads=1)
    scheduler = BatchScheduler(options, None)
    run = doubling_run(calls)
    with ThreadPoolExecutor(2) as pool:
        waiting = pool.submit(scheduler.submit, "k", run, {"x": np.ones((1, 2), np.float32)}, 1)
        time.sleep(0.2)  # its batch is open and waits for its 60 s timeout
        with pytest.raises(QueueFull, match="queue to which this task was submitted is full"):
            scheduler.submit("k", run, {"x": np.ones((2, 2), np.float32)}, 2)
        started = time.monotonic()
        scheduler.close()
        assert waiting.result(timeout=5)["double"].tolist() == [[2, 2]]
        assert time.monotonic() - started < 5, "the drain does not wait for the batch timeout"


# --- serve-local with --enable_batching -------------------------------------------------------------


def start_batching(start, tmp_path, base, params: str, *flags: str):
    """serve-local with these batching parameters and metrics on, by `start` (in process or a process)."""
    (tmp_path / "batching.config").write_text(params)
    (tmp_path / "monitoring.config").write_text(MONITORING)
    server = start(
        f"--model_name={base.name}", f"--model_base_path={base}", "--enable_batching",
        f"--batching_parameters_file={tmp_path / 'batching.config'}",
        f"--monitoring_config_file={tmp_path / 'monitoring.config'}", "--grpc_max_threads=64", *flags,
    )  # fmt: skip
    server.wait_available(base.name, 1)
    return server


def metric(text: str, line_start: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start))


def scrape(server) -> str:
    return DIRECT.open(server.rest + "/monitoring/prometheus/metrics", timeout=10).read().decode()


@pytest.mark.unit
def test_concurrent_clients_get_unbatched_answers_without_padding(serve_in_process, model_versions, tmp_path):
    install_version(model_versions[0], tmp_path / "m", 1)
    params = (
        "max_batch_size { value: 16 }\nbatch_timeout_micros { value: 2000 }\nnum_batch_threads { value: 1 }\n"
        "max_enqueued_batches { value: 100 }\nallowed_batch_sizes: 4\nallowed_batch_sizes: 16\n"
    )
    server = start_batching(serve_in_process, tmp_path, tmp_path / "m", params)
    predict, _ = stubs(server)
    rng = np.random.default_rng(7)
    requests = [rng.integers(0, 256, (1 + i % 3, 8, 8, 1), dtype=np.uint8) for i in range(192)]
    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(lambda x: predict.Predict(predict_request(images=x), timeout=60), requests))
    model = LoadedModel(model_versions[0])
    for images, answer in zip(requests, answers):
        want = model.run("serving_default", {"images": images})
        got = from_tensor_proto(answer.outputs["probabilities"])
        assert got.shape == want["probabilities"].shape, "exactly the caller's rows: no padding, no neighbours"
        np.testing.assert_allclose(got, want["probabilities"], atol=1e-5)
        np.testing.assert_array_equal(from_tensor_proto(answer.outputs["classes"]), want["classes"])
    text = scrape(server)
    batches = metric(text, ":tensorflow:serving:batching_session:processed_batch_size_count")
    merged = batches - metric(text, ':tensorflow:serving:batching_session:processed_batch_size_bucket{le="2"}')
    assert batches < len(requests) and merged > 0, "batches larger than two requests' worth ran"
    assert metric(text, ":tensorflow:serving:batching_session:padding_size_sum") > 0
    assert metric(text, ":tensorflow:serving:batching_session:input_batch_size_count") == len(requests)
    latency = ':tensorflow:serving:request_latency_count{model_name="m",API="Predict",entrypoint="GRPC"}'
    assert metric(text, latency) == len(requests)
    assert re.search(r'request_latency_bucket\{model_name="m",API="Predict",entrypoint="GRPC",le="\+Inf"\}', text)
    assert metric(text, ':tensorflow:serving:request_count{model_name="m",api="predict",status="OK"}') == len(requests)


@pytest.mark.integration
def test_full_queue_is_unavailable_and_sigterm_drains_queued_requests(serve_local, model_versions, tmp_path):
    install_version(model_versions[0], tmp_path / "m", 1)
    params = (
        "max_batch_size { value: 4 }\nbatch_timeout_micros { value: 60000000 }\nnum_batch_threads { value: 1 }\n"
        "max_enqueued_batches { value: 1 }\n"
    )
    server = start_batching(serve_local, tmp_path, tmp_path / "m", params)
    predict, _ = stubs(server)
    images = np.random.default_rng(3).integers(0, 256, (3, 8, 8, 1), dtype=np.uint8)
    queued = [predict.Predict.future(predict_request(images=images[i : i + 1]), timeout=120) for i in range(2)]
    time.sleep(1)
    assert not any(f.done() for f in queued), "both wait in the open batch for its 60 s timeout"
    with pytest.raises(grpc.RpcError) as err:  # 3 rows do not fit the open batch: a second one is refused
        predict.Predict(predict_request(images=images), timeout=30)
    error = err.value
    assert error.code() == grpc.StatusCode.UNAVAILABLE and "is full" in error.details()
    status, body = server.post("/v1/models/m:predict", {"instances": images.tolist()})  # REST's blocking path
    assert status == 503 and "is full" in body["error"], (status, body)
    refused = ':tensorflow:serving:request_count{model_name="m",api="predict",status="UNAVAILABLE"}'
    assert metric(scrape(server), refused) == 2, "the gRPC and the REST refusal, each counted by its status"
    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    want = LoadedModel(model_versions[0]).run("serving_default", {"images": images[:2]})["probabilities"]
    for i, future in enumerate(queued):
        np.testing.assert_allclose(from_tensor_proto(future.result().outputs["probabilities"]), want[i : i + 1], 1e-5)
    assert server.proc.wait(timeout=60) == 0 and time.monotonic() - started < 30
    assert "finishing 2 in-flight request(s)" in server.log() and "stopped cleanly" in server.log()


@pytest.mark.unit
def test_multi_input_model_is_batched_and_odd_requests_run_alone(serve_in_process, tmp_path):
    save_foreign_model(tmp_path / "f" / "1")
    params = "max_batch_size { value: 32 }\nbatch_timeout_micros { value: 5000 }\nnum_batch_threads { value: 1 }\n"
    server = start_batching(serve_in_process, tmp_path, tmp_path / "f", params)
    predict, _ = stubs(server)
    rng = np.random.default_rng(11)
    cases = [(rng.normal(size=(1 + i % 4, 3)).astype(np.float32), rng.integers(0, 99, 1 + i % 4)) for i in range(64)]

    def call(case):
        x, offset = case
        return predict.Predict(predict_request("f", x=x, offset=offset.astype(np.int64)), timeout=60)

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(call, cases))
    for (x, offset), answer in zip(cases, answers):
        np.testing.assert_allclose(from_tensor_proto(answer.outputs["scaled"]), x * 2, rtol=1e-6)
        np.testing.assert_array_equal(from_tensor_proto(answer.outputs["shifted"]), offset + 1)
        np.testing.assert_allclose(from_tensor_proto(answer.outputs["total"]), x.sum(axis=1), rtol=1e-5)
    assert metric(scrape(server), ":tensorflow:serving:batching_session:processed_batch_size_count") < len(cases)
    # Not concatenable with anything (rows differ between inputs; a scalar input): each runs alone.
    odd = predict.Predict(predict_request("f", x=np.ones((2, 3), np.float32), offset=np.arange(3)), timeout=30)
    assert from_tensor_proto(odd.outputs["shifted"]).tolist() == [1, 2, 3]
    slow = predict.Predict(predict_request("f", signature="slow", steps=np.array(2, np.int32)), timeout=30)
    assert np.isfinite(from_tensor_proto(slow.outputs["checksum"]))
