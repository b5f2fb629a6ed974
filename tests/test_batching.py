"""Request batching: the scheduler alone (a fake model), then serve-local with `--enable_batching` as clients
see it, in process (serve() on a thread, real gRPC). No test waits for a batch timeout: the timeouts are an hour
long, so a batch that runs was closed, full or drained, and the tests wait on what the scheduler queued."""

from __future__ import annotations

import re
import threading
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

HOUR_MICROS = 3_600_000_000  # a batch timeout no test waits for: a batch that runs sooner was not timed out


def doubling_run(calls: list, gate: threading.Event | None = None, running: threading.Event | None = None):
    """A fake model: records each batch's rows, sets `running`, waits for `gate`, answers 2x and a per-row sum."""

    def run(inputs):
        calls.append(len(inputs["x"]))
        if running is not None:
            running.set()
        if gate is not None:
            assert gate.wait(60), "the test never opened the gate"
        return {"double": inputs["x"] * 2, "total": inputs["x"].sum(axis=1)}

    return run


class QueuedTasks:
    """Counts the tasks every BatchScheduler in this process queued (the in-process server's too), so that a
    test waits until requests sit in their batch instead of sleeping for it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self._changed = threading.Condition()
        enqueue = BatchScheduler.enqueue

        def counting_enqueue(scheduler, *args, **kwargs):
            task = enqueue(scheduler, *args, **kwargs)  # raises QueueFull for a refused task: not counted
            if task is not None:
                with self._changed:
                    self.count += 1
                    self._changed.notify_all()
            return task

        monkeypatch.setattr(BatchScheduler, "enqueue", counting_enqueue)

    def wait_for(self, count: int) -> None:
        with self._changed:
            # The bound only ends a broken run: a request reaches its queue in milliseconds.
            assert self._changed.wait_for(lambda: self.count >= count, 60), f"{self.count} of {count} tasks queued"


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
    calls, running, gate = [], threading.Event(), threading.Event()
    scheduler = BatchScheduler(Batching(max_batch_size=64, num_batch_threads=1), None)
    run = doubling_run(calls, gate, running)
    rows = [np.full((1 + i % 3, 2), i, np.float32) for i in range(20)]
    first = scheduler.enqueue("k", run, {"x": rows[0]}, len(rows[0]))
    assert running.wait(60), "the first task's batch runs at once (no timeout) on the only batch thread"
    rest = [scheduler.enqueue("k", run, {"x": x}, len(x)) for x in rows[1:]]  # queued behind it: one batch
    gate.set()
    answers = [task.future.result(timeout=60) for task in (first, *rest)]
    scheduler.close()
    for x, answer in zip(rows, answers):
        np.testing.assert_array_equal(answer["double"], x * 2)
        np.testing.assert_array_equal(answer["total"], x.sum(axis=1))
    assert calls == [len(rows[0]), sum(map(len, rows[1:]))], f"batches run: {calls}"


@pytest.mark.unit
def test_a_later_loads_warmup_records_take_the_batch_threads_and_served_batches_wait_behind_them(monkeypatch):
    """As TF Serving replays warmup through the batching session: the staging watch's live test relies on it."""
    from trainserve.serving import manager as manager_module
    from trainserve.serving.manager import ModelManager
    from trainserve.serving.servables import Servables

    records = [("serving_default", {"x": np.ones((n, 2), np.float32)}) for n in (1, 4, 9)]  # 9 > max_batch_size
    monkeypatch.setattr(manager_module, "read_warmup_inputs", lambda path: records)
    manager, running, gate, threads = ModelManager(), threading.Event(), threading.Event(), []
    servables = Servables(manager, Batching(max_batch_size=8, batch_timeout_micros=0, num_batch_threads=1))

    class Loaded:  # a version being loaded; its first warmup record holds the batch thread until the gate opens
        path = None

        def run(self, signature, inputs):
            threads.append(threading.current_thread().name)
            running.set()
            assert gate.wait(60), "the test never opened the gate"
            return {"double": inputs["x"] * 2}

    warmup = threading.Thread(target=manager._replay_warmup, args=(Loaded(),), name="poll", daemon=True)
    warmup.start()
    assert running.wait(60), "the first warmup record runs"
    served = servables.scheduler.enqueue("stable", doubling_run([]), {"x": np.ones((1, 2), np.float32)}, 1)
    assert not served.future.done()  # the only batch thread runs the warmup record: a served batch waits
    gate.set()
    assert served.future.result(timeout=60)["double"].tolist() == [[2.0, 2.0]]
    warmup.join(60)
    servables.drain()
    assert threads == ["batch-0", "batch-0", "poll"], threads  # the record over max_batch_size ran alone


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
    options = Batching(max_batch_size=2, batch_timeout_micros=HOUR_MICROS, max_enqueued_batches=1, num_batch_threads=1)
    scheduler = BatchScheduler(options, None)
    run = doubling_run(calls)
    waiting = scheduler.enqueue("k", run, {"x": np.ones((1, 2), np.float32)}, 1)  # opens a batch of 1 row of 2
    with pytest.raises(QueueFull, match="queue to which this task was submitted is full"):
        scheduler.submit("k", run, {"x": np.ones((2, 2), np.float32)}, 2)  # does not fit: a second batch
    assert not waiting.future.done() and calls == [], "its batch waits for its timeout"
    closing = threading.Thread(target=scheduler.close)
    closing.start()
    # The timeout is an hour: an answer now comes from the drain, which does not wait for it.
    assert waiting.future.result(timeout=60)["double"].tolist() == [[2, 2]]
    closing.join(60)
    assert not closing.is_alive() and calls == [1]
    assert scheduler.enqueue("k", run, {"x": np.ones((1, 2), np.float32)}, 1) is None, "closed: the caller runs it"


# --- serve-local with --enable_batching -------------------------------------------------------------


def start_batching(start, tmp_path, base, params: str, *flags: str):
    """serve-local with these batching parameters and metrics on, by `start` (in process or a process)."""
    (tmp_path / "batching.config").write_text(params)
    (tmp_path / "monitoring.config").write_text(MONITORING)
    server = start(
        f"--model_name={base.name}",
        f"--model_base_path={base}",
        "--enable_batching",
        f"--batching_parameters_file={tmp_path / 'batching.config'}",
        f"--monitoring_config_file={tmp_path / 'monitoring.config'}",
        "--grpc_max_threads=64",
        *flags,
    )
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
    latency = ':tensorflow:serving:request_latency_count{model_name="m",version="1",API="Predict",entrypoint="GRPC"}'
    assert metric(text, latency) == len(requests)
    assert re.search(
        r'request_latency_bucket\{model_name="m",version="1",API="Predict",entrypoint="GRPC",le="\+Inf"\}', text
    )
    assert metric(
        text, ':tensorflow:serving:request_count{model_name="m",version="1",api="predict",status="OK"}'
    ) == len(requests)


@pytest.mark.unit
def test_full_queue_is_unavailable_and_stopping_drains_queued_requests(
    serve_in_process, model_versions, tmp_path, monkeypatch
):
    tasks = QueuedTasks(monkeypatch)
    install_version(model_versions[0], tmp_path / "m", 1)
    params = (
        f"max_batch_size {{ value: 4 }}\nbatch_timeout_micros {{ value: {HOUR_MICROS} }}\n"
        "num_batch_threads { value: 1 }\nmax_enqueued_batches { value: 1 }\n"
    )
    server = start_batching(serve_in_process, tmp_path, tmp_path / "m", params)
    predict, _ = stubs(server)
    images = np.random.default_rng(3).integers(0, 256, (3, 8, 8, 1), dtype=np.uint8)
    queued = [predict.Predict.future(predict_request(images=images[i : i + 1]), timeout=120) for i in range(2)]
    tasks.wait_for(2)
    assert not any(f.done() for f in queued), "both wait in the open batch for its hour-long timeout"
    with pytest.raises(grpc.RpcError) as err:  # 3 rows do not fit the open batch: a second one is refused
        predict.Predict(predict_request(images=images), timeout=30)
    error = err.value
    assert error.code() == grpc.StatusCode.UNAVAILABLE and "is full" in error.details()
    status, body = server.post("/v1/models/m:predict", {"instances": images.tolist()})  # REST's blocking path
    assert status == 503 and "is full" in body["error"], (status, body)
    refused = ':tensorflow:serving:request_count{model_name="m",version="1",api="predict",status="UNAVAILABLE"}'
    assert metric(scrape(server), refused) == 2, "the gRPC and the REST refusal, each counted by its status"
    # Stop as SIGTERM does (test_serve_local sends the signal to a process): the drain runs the open batch now,
    # so the answers come although its timeout is an hour away.
    assert server.stop() == 0
    want = LoadedModel(model_versions[0]).run("serving_default", {"images": images[:2]})["probabilities"]
    for i, future in enumerate(queued):
        answer = future.result(timeout=60).outputs["probabilities"]
        np.testing.assert_allclose(from_tensor_proto(answer), want[i : i + 1], 1e-5)
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
