"""`trainserve load` against real serve-local servers over real gRPC: the closed loop's counts checked against the
server's own, the open loop's Poisson schedule and its latency-from-scheduled-time rule on a fake clock, coordinated
omission shown on a server the test holds, synthetic inputs from the signature, the report's schema, bad flags in
one line. No assertion depends on this machine's speed: bench/eval_throughput.py measures that."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import Future
from contextlib import nullcontext
from itertools import islice

import grpc
import numpy as np
import pytest

from conftest import (
    ServeLocal,
    assert_one_line_error,
    install_version,
    predict_count,
    run_cli,
    save_foreign_model,
    serve_counted,
)
from trainserve.cli import main
from trainserve.client import Signature
from trainserve.evaluation.load.config import LoadConfig
from trainserve.evaluation.load.inputs import PREDICT_METHOD, synthetic_inputs
from trainserve.evaluation.load.measure import Load, Recorder, Request, Window, is_stable, poisson_arrivals
from trainserve.evaluation.load.report import best_point, validate_load_report
from trainserve.evaluation.load.sweep import run_sweep
from trainserve.protos import predict_pb2
from trainserve.savedmodel import LoadedModel, TensorSpecInfo
from trainserve.sources import load_dataset
from trainserve.tensors import to_tensor_proto


def _serve(root, model: str, version_dir) -> ServeLocal:
    install_version(version_dir, root / model, 1)
    return serve_counted(root, model, own_process=True)


@pytest.fixture
def own_m(model_versions, tmp_path):
    """serve-local on a thread of this process with the tiny 8x8x1 CNN as model m, for one test alone: every
    Predict its counters see is that test's."""
    install_version(model_versions[0], tmp_path / "m", 1)
    server = serve_counted(tmp_path, "m")
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def served_f(tmp_path_factory):
    """serve-local with the foreign model f: serving_default (x float32 [N, 3], offset int64 [N]) and `slow`."""
    root = tmp_path_factory.mktemp("load-f")
    server = _serve(root, "f", save_foreign_model(root / "saved"))
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def idle_f(tmp_path_factory):
    """The foreign model f on a server no load test touches (in this process): a server still finishing the
    requests an open-loop test cancelled would count them in the next test's "nothing was sent" check."""
    root = tmp_path_factory.mktemp("idle-f")
    install_version(save_foreign_model(root / "saved"), root / "f", 1)
    server = serve_counted(root, "f")
    yield server
    assert server.stop() == 0


def _request(model: str, signature: str = "serving_default", **inputs) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name, request.model_spec.signature_name = model, signature
    for key, value in inputs.items():
        to_tensor_proto(value, into=request.inputs[key])
    return request


@pytest.mark.integration
def test_closed_loop_counts_what_the_server_answered(own_m, model_versions):
    digits = load_dataset("digits")
    images, labels = digits.x_test[:8], digits.y_test[:8]
    # max_windows 3: the three windows the report counts are all the point has, so it accounts for every request.
    config = LoadConfig(
        server=own_m.target,
        model="m",
        data="digits",
        limit=8,
        batch_sizes=(8,),
        concurrency=(1,),
        window_s=0.3,
        max_windows=3,
        wait=60,
    )
    before = predict_count(own_m)
    started = time.perf_counter()
    report = run_sweep(config).report
    elapsed = time.perf_counter() - started
    answered_by_server = predict_count(own_m) - before
    (point,) = report["points"]
    sent = round(point["sent_rps"] * point["duration_s"])
    assert point["windows"] == 3 and point["error_count"] == 0 and point["requests"] > 0
    # One worker has at most one request outside the counts: sent in the last window and answered after it
    # closed, or sent after it closed and before the worker stopped. Every other one is counted once.
    assert 0 <= sent - point["requests"] <= 1
    assert 0 <= answered_by_server - sent <= 1
    # Rates are the counts over the windows' own seconds, which cover the three windows and no more than the run.
    assert 3 * config.window_s * (1 - 1e-9) <= point["duration_s"] <= elapsed
    assert point["throughput_rps"] == pytest.approx(point["requests"] / point["duration_s"])
    assert point["examples_per_s"] == pytest.approx(8 * point["throughput_rps"])
    assert point["latency_ms"]["p50"] <= point["latency_ms"]["p99"] <= 1000 * point["duration_s"]
    # Every answer was checked against its labels: the same accuracy the model has on those 8 digits.
    expected = np.mean(LoadedModel(model_versions[0]).run("serving_default", {"images": images})["classes"] == labels)
    assert point["quality"]["accuracy"] == pytest.approx(expected)
    assert point["quality"]["checked_examples"] == 8 * point["requests"]
    validate_load_report(report)


@pytest.mark.unit
def test_poisson_schedule_has_the_rate_and_follows_the_seed():
    due = np.fromiter(islice(poisson_arrivals(250.0, seed=3), 20_000), float)
    gaps = np.diff(due, prepend=0.0)
    assert (gaps > 0).all()
    assert len(due) / due[-1] == pytest.approx(250, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1, rel=0.05), "exponential gaps (Poisson), not a metronome"
    assert list(islice(poisson_arrivals(250.0, seed=3), 5)) == due[:5].tolist()
    assert list(islice(poisson_arrivals(250.0, seed=4), 5)) != due[:5].tolist()


class LateSender:
    """A fake Predict on a fake clock: every send takes `late` seconds of that clock and is answered at once, so
    the client falls further behind its schedule with each request; after `count` sends it stops the load."""

    def __init__(self, late: float, count: int, stop: threading.Event):
        self.now, self.late, self.count, self.stop = 0.0, late, count, stop
        self.payloads: list[bytes] = []

    def clock(self) -> float:
        return self.now

    def future(self, payload: bytes, timeout: float) -> Future:
        self.now += self.late
        self.payloads.append(payload)
        if len(self.payloads) == self.count:
            self.stop.set()
        answer: Future = Future()
        answer.set_result(b"answer")
        return answer


@pytest.mark.unit
def test_open_loop_sends_each_arrival_once_and_counts_latency_from_its_scheduled_time():
    requests = [Request(bytes([i]), 1) for i in range(3)]
    stop = threading.Event()
    sender = LateSender(late=0.5, count=10, stop=stop)
    load = Load(sender, requests, timeout_s=1.0, rate=100.0, seed=5, stop=stop, clock=sender.clock)
    recorder = Recorder(keep_answers=False)
    for thread in load.start(recorder):
        thread.join(30)
        assert not thread.is_alive()
    window = recorder.take(1.0)
    due = list(islice(poisson_arrivals(100.0, seed=5), 10))  # the clock reads 0 when the loop starts
    answered = [0.5 * (i + 1) for i in range(10)]  # the fake clock after each send
    assert sender.payloads == [requests[i % 3].payload for i in range(10)], "each arrival sent once, in turn"
    assert window.sent == 10 and load.unfinished == 0 and window.errors == {}
    # From the scheduled time: the later the client, the longer the latency (from the send it would be 0.5 each).
    assert window.latencies_s.tolist() == pytest.approx([a - d for a, d in zip(answered, due)])
    assert load.max_send_lag_s == pytest.approx(answered[-1] - due[-1])


class HeldRuns:
    """Every LoadedModel.run of the in-process server waits until the test releases it; arrivals are counted."""

    def __init__(self, monkeypatch):
        self.arrived = 0
        self._released = threading.Event()
        self._changed = threading.Condition()
        run = LoadedModel.run

        def held(model, *args, **kwargs):
            with self._changed:
                self.arrived += 1
                self._changed.notify_all()
            assert self._released.wait(60), "the test never released the server"
            return run(model, *args, **kwargs)

        monkeypatch.setattr(LoadedModel, "run", held)

    def wait_arrived(self, n: int) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: self.arrived >= n, 60), f"timed out waiting for {n} runs"

    def release(self) -> None:
        self._released.set()


class WatchedRecorder(Recorder):
    """A Recorder the test can wait on: requests sent, and each answer's latency by its request's index in the
    load's list (every request object distinct, so an answer names the request it answers)."""

    def __init__(self, requests: list[Request]):
        super().__init__(keep_answers=False)
        self._index = {id(r): i for i, r in enumerate(requests)}
        self.sends = 0
        self.latency: dict[int, float] = {}
        self._changed = threading.Condition()

    def sent(self) -> None:
        super().sent()
        with self._changed:
            self.sends += 1
            self._changed.notify_all()

    def answered(self, request: Request, latency_s: float, answer: bytes | None, error: str | None) -> None:
        super().answered(request, latency_s, answer, error)
        assert error is None, error
        with self._changed:
            self.latency[self._index[id(request)]] = latency_s
            self._changed.notify_all()

    def wait_for(self, predicate, what: str) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: predicate(self), 60), f"timed out waiting for {what}"


@pytest.fixture
def held_runs(monkeypatch):
    """LoadedModel.run held until the test releases it; released at teardown too, so a failed test leaves no
    server thread waiting."""
    held = HeldRuns(monkeypatch)
    yield held
    held.release()


@pytest.mark.integration
def test_open_loop_shows_the_queue_a_closed_loop_hides(own_m, held_runs):
    """Coordinated omission, on a server the test holds: the closed loop's one worker waits with its one request,
    while open-loop arrivals keep coming on schedule; once released, every one of them carries the wait."""
    held = held_runs
    payload = _request("m", images=np.zeros((1, 8, 8, 1), np.uint8)).SerializeToString()
    closed_requests, open_requests = ([Request(payload, 1) for _ in range(10_000)] for _ in range(2))
    closed_seen, open_seen = WatchedRecorder(closed_requests), WatchedRecorder(open_requests)
    channel = grpc.insecure_channel(own_m.target)
    call = channel.unary_unary(PREDICT_METHOD)
    closed = Load(call, closed_requests, timeout_s=60, concurrency=1)
    opened = Load(call, open_requests, timeout_s=60, rate=200.0)
    threads = closed.start(closed_seen)
    held.wait_arrived(1)
    closed_held = time.perf_counter()  # the closed loop's first request is running, held
    threads += opened.start(open_seen)
    k = 20
    open_seen.wait_for(lambda r: r.sends >= k, f"{k} open-loop requests")
    k_sent = time.perf_counter()  # the first k were due before this
    open_seen.wait_for(lambda r: r.sends >= 2 * k, f"{2 * k} open-loop requests")  # the hold goes on
    assert closed_seen.sends == 1, "a closed loop sends nothing while its request waits"
    assert not open_seen.latency, "the open loop sent on schedule with every request outstanding"
    released = time.perf_counter()  # the same clock the load reads
    held.release()
    open_seen.wait_for(lambda r: all(i in r.latency for i in range(k)), f"the first {k} answers")
    closed_seen.wait_for(lambda r: 0 in r.latency, "the closed loop's first answer")
    closed.stop.set()
    opened.stop.set()
    for thread in threads:
        thread.join(60)
    channel.close()
    # Each of the first k open-loop requests waited out the hold from its scheduled time: k samples show the
    # queue, where the closed loop's one request is the only sample that shows it.
    hold = released - k_sent
    assert min(open_seen.latency[i] for i in range(k)) >= hold > 0
    assert closed_seen.latency[0] >= released - closed_held


@pytest.mark.integration
def test_synthetic_inputs_cli_report_and_plot(served_f, tmp_path, capsys):
    code = main(
        [
            "load",
            "--server",
            served_f.target,
            "--model",
            "f",
            "--batch-sizes",
            "1,4",
            "--concurrency",
            "2",
            "--window-s",
            "0.3",
            "--max-windows",
            "3",
            "--latency-budget-ms",
            "1000",
            "--report",
            str(tmp_path / "load.json"),
            "--plots",
            str(tmp_path / "plots"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    report = json.loads((tmp_path / "load.json").read_text())
    validate_load_report(report)
    assert report["schema"] == "trainserve.load/1" and report["inputs"]["checked"] is False
    one, four = report["points"]
    assert (one["batch_size"], four["batch_size"]) == (1, 4) and one["error_count"] == four["error_count"] == 0
    assert four["examples_per_s"] == pytest.approx(4 * four["throughput_rps"])
    # The fastest point, among the stable ones when any is (on a busy machine a 0.3 s window may not settle).
    ranked = [p for p in (one, four) if p["stable"]] or [one, four]
    assert report["best"]["examples_per_s"] == max(p["examples_per_s"] for p in ranked)
    assert "best with p99 <= 1000 ms" in out and "C=2" in out
    assert (tmp_path / "plots" / "throughput_vs_p99.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.unit
def test_synthetic_inputs_follow_the_signature():
    spec = lambda key, dtype, shape: TensorSpecInfo(key, f"{key}:0", np.dtype(dtype), shape)  # noqa: E731
    signature = Signature(
        {
            "x": spec("x", "float32", (None, 3)),
            "ids": spec("ids", "int64", (None, None)),
            "img": spec("img", "uint8", (None, 8, 8, 1)),
            "n": spec("n", "int32", ()),
        },
        {},
    )
    arrays, examples = synthetic_inputs(signature, 5, {"n": 7}, np.random.default_rng(0))
    assert examples == 5
    assert {k: (a.dtype.name, a.shape) for k, a in arrays.items()} == {
        "x": ("float32", (5, 3)),
        "ids": ("int64", (5, 1)),
        "img": ("uint8", (5, 8, 8, 1)),
        "n": ("int32", ()),
    }
    assert arrays["n"] == 7 and arrays["img"].max() > 1 and set(np.unique(arrays["ids"])) <= {0, 1}


def _window(rps: float, latency_ms: float, sent: float | None = None) -> Window:
    n = int(rps)
    return Window(1.0, np.full(n, latency_ms / 1000), n, {}, int(sent if sent is not None else n))


@pytest.mark.unit
@pytest.mark.parametrize(
    "windows, rate_mode, stable",
    [
        pytest.param([(100, 10), (100, 10), (104, 10.5), (97, 9.6)], False, True, id="last-three-agree"),
        pytest.param([(100, 10), (100, 10)], False, False, id="fewer-than-three"),
        pytest.param([(100, 10), (100, 10), (125, 10)], False, False, id="throughput-drifts"),
        pytest.param([(100, 10), (100, 14), (100, 20)], False, False, id="latency-grows"),
        pytest.param([(100, 10, 100), (80, 10, 80), (120, 10, 120)], True, True, id="poisson-arrivals-kept-pace"),
        pytest.param([(100, 10, 100), (80, 10, 110), (120, 10, 95)], True, False, id="falling-behind"),
    ],
)
def test_stability_rule(windows, rate_mode, stable):
    assert is_stable([_window(*w) for w in windows], "avg", rate_mode) is stable


@pytest.mark.unit
def test_best_point_is_the_fastest_stable_point_within_the_budget():
    def point(ex, p99, stable=True):
        return {"examples_per_s": ex, "latency_ms": {"p99": p99}, "stable": stable}

    points = [point(100, 5), point(300, 20), point(250, 9), point(280, 8, stable=False), {"latency_ms": None}]
    assert best_point(points, 10) == 2
    assert best_point(points, None) == 1
    assert best_point([point(280, 8, stable=False)], 10) == 0, "an unstable point only when none is stable"
    assert best_point(points, 1) is None


@pytest.mark.unit
@pytest.mark.parametrize(
    "args, fragment",
    [
        pytest.param(["--concurrency", "0"], "expected integers >= 1", id="zero-concurrency"),
        pytest.param(["--rate", "fast"], "expected numbers > 0", id="bad-rate"),
        pytest.param(["--batch-sizes", "1,,x"], "expected integers >= 1", id="bad-batch-sizes"),
        pytest.param(["--max-windows", "2"], "--max-windows 2: expected >= 3", id="too-few-windows"),
        pytest.param(["--window-s", "0"], "--window-s 0: expected seconds > 0", id="zero-window"),
        pytest.param(["--data", "digits", "--fill", "x=1"], "--fill and --data both given", id="fill-with-data"),
        pytest.param(
            ["--fill", "nope=1"],
            "--fill nope: signature 'serving_default' of model 'f' has no such input",
            id="fill-unknown-input",
        ),
        pytest.param(["--signature", "nope"], "signature 'nope' not found", id="unknown-signature"),
    ],
)
def test_bad_flags_fail_in_one_line_before_any_predict(idle_f, capsys, args, fragment):
    before = predict_count(idle_f)
    with pytest.raises(SystemExit) if args[0] in ("--concurrency", "--rate", "--batch-sizes") else nullcontext():
        code = main(["load", "--server", idle_f.target, "--model", "f", *args])
        assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "error:" in err[-1] and fragment in err[-1], err[-1]
    assert predict_count(idle_f) == before, "no Predict was sent"


@pytest.mark.unit
def test_bad_flag_in_a_fresh_process_is_one_line(tmp_path):
    proc = run_cli("load", "--rate", "-5", cwd=tmp_path)
    assert_one_line_error(proc, "--rate", "expected numbers > 0")
    assert proc.returncode == 2


@pytest.mark.integration
def test_failed_requests_are_counted_by_code_and_the_sweep_goes_on(served_f):
    # A 1 us deadline has passed before a request leaves the client, however fast the server: every request
    # fails with DEADLINE_EXCEEDED (counted, not raised), and both points are still measured.
    config = LoadConfig(
        server=served_f.target,
        model="f",
        signature="slow",
        fill={"steps": 10.0},
        batch_sizes=(1, 2),
        concurrency=(1,),
        timeout=1e-6,
        window_s=0.2,
        max_windows=3,
    )
    result = run_sweep(config)
    assert [p["batch_size"] for p in result.report["points"]] == [1, 2]
    for point in result.report["points"]:
        assert point["errors"] == {"DEADLINE_EXCEEDED": point["error_count"]} and point["error_count"] > 0
        assert point["latency_ms"] is None and point["requests"] == 0
    assert result.report["best"] is None and result.passed, "no budget given: nothing to fail"
    validate_load_report(result.report)
