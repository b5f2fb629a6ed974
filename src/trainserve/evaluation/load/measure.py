"""One load point, measured as Triton's perf_analyzer measures: consecutive windows while the load runs,
until the last 3 agree within 10 % (throughput and latency) or `max_windows` have passed (unstable).

Two ways to load the server:
- closed loop (`concurrency` C): C workers, each sends a request, waits for its answer, sends the next;
- open loop (`rate` R): Poisson arrivals at R requests/s, each sent at its scheduled time whatever is still
  outstanding, its latency counted from that scheduled time. A client that waits before sending hides a
  slow server (coordinated omission); this one does not: a queue at the server shows as growing latency.

Requests go out as pre-serialized PredictRequest bytes, and answers to check are kept as bytes and checked
after the point's last window, so the client spends its measured time waiting, not encoding or decoding
(on a machine it shares with the server, client CPU would lower the server's throughput). A failed
request is counted by its gRPC code and the load goes on.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import grpc
import numpy as np

STABILITY_WINDOWS, STABILITY_TOLERANCE = 3, 0.10  # perf_analyzer's rule


@dataclass(frozen=True)
class Request:
    """One pre-built Predict: its bytes, how many examples it carries, their labels (None: unchecked)."""

    payload: bytes
    examples: int
    labels: object = None  # np.ndarray of the batch's labels, where answers are checked


CHECK_BUDGET_BYTES = 64 << 20  # answers kept per point for checking; beyond it the rest go unchecked


@dataclass(frozen=True)
class Window:
    """What completed in one window: latencies of the answered requests, errors by gRPC code."""

    duration_s: float
    latencies_s: np.ndarray
    examples: int
    errors: dict[str, int]
    sent: int  # requests sent in the window (open loop: at their arrival times, or as soon after as it could)

    @property
    def throughput_rps(self) -> float:
        return len(self.latencies_s) / self.duration_s

    def latency_ms(self, which: str) -> float | None:
        if not len(self.latencies_s):
            return None
        return float(1000 * (np.mean(self.latencies_s) if which == "avg" else np.percentile(self.latencies_s, 99)))


class Recorder:
    """Thread-safe: answers land here from the workers; the measuring thread takes them window by window."""

    def __init__(self, keep_answers: bool):
        self._lock = threading.Lock()
        self._keep = keep_answers
        self._open = True
        self.answers: list[tuple[Request, bytes]] = []  # to check against the labels once the point ends
        self._kept_bytes = 0
        self._reset()

    def _reset(self) -> None:
        self._latencies: list[float] = []
        self._examples, self._sent = 0, 0
        self._errors: Counter[str] = Counter()

    def sent(self) -> None:
        with self._lock:
            self._sent += 1

    def answered(self, request: Request, latency_s: float, answer: bytes | None, error: str | None) -> None:
        with self._lock:
            if not self._open:
                return
            if error is None:
                self._latencies.append(latency_s)
                self._examples += request.examples
                if self._keep and self._kept_bytes < CHECK_BUDGET_BYTES:
                    self.answers.append((request, answer))
                    self._kept_bytes += len(answer)
            else:
                self._errors[error] += 1

    def take(self, duration_s: float) -> Window:
        with self._lock:
            window = Window(duration_s, np.asarray(self._latencies), self._examples, dict(self._errors), self._sent)
            self._reset()
        return window

    def close(self) -> None:
        with self._lock:
            self._open = False


def is_stable(windows: list[Window], latency: str, rate_mode: bool) -> bool:
    """The last 3 windows within 10 % of their mean, for throughput and for latency.

    Open loop: a window's arrivals are random (Poisson, +-1/sqrt(n)), so the throughput compared is
    answers per request sent (keeping pace), not answers per second."""
    if len(windows) < STABILITY_WINDOWS:
        return False
    last = windows[-STABILITY_WINDOWS:]
    throughput = [len(w.latencies_s) / max(w.sent, 1) if rate_mode else w.throughput_rps for w in last]
    latencies = [w.latency_ms(latency) for w in last]
    if any(v is None for v in latencies):
        return all(v is None for v in latencies) and _within(throughput)
    return _within(throughput) and _within(latencies)


def _within(values: list[float]) -> bool:
    mean = sum(values) / len(values)
    return all(abs(v - mean) <= STABILITY_TOLERANCE * mean for v in values)


def poisson_arrivals(rate: float, seed: int) -> Iterator[float]:
    """The open loop's schedule: seconds after the start at which each request is due, Poisson arrivals at
    `rate` requests/s (exponential gaps), the same for the same seed."""
    rng = np.random.default_rng(seed)
    due = 0.0
    while True:
        due += rng.exponential(1 / rate)
        yield due


@dataclass
class Load:
    """How one point loads the server: `concurrency` workers (closed loop) or `rate` requests/s (open)."""

    call: grpc.UnaryUnaryMultiCallable  # Predict, bytes in and bytes out
    requests: list[Request]
    timeout_s: float
    concurrency: int | None = None
    rate: float | None = None
    seed: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    max_send_lag_s: float = 0.0  # open loop: how late the client sent its latest request (its own limit)
    unfinished: int = 0  # open loop: requests still outstanding when the point ended
    clock: Callable[[], float] = time.perf_counter  # seconds; latencies and the schedule are read on it

    def start(self, recorder: Recorder) -> list[threading.Thread]:
        if self.rate is not None:
            targets = [lambda: self._open_loop(recorder)]
        else:
            targets = [lambda i=i: self._worker(i, recorder) for i in range(self.concurrency or 1)]
        threads = [threading.Thread(target=t, daemon=True, name="load") for t in targets]
        for thread in threads:
            thread.start()
        return threads

    def _worker(self, index: int, recorder: Recorder) -> None:
        """Closed loop: send, wait for the answer, send again."""
        n = index
        while not self.stop.is_set():
            request = self.requests[n % len(self.requests)]
            n += self.concurrency or 1
            recorder.sent()
            started = self.clock()
            try:
                answer, error = self.call(request.payload, timeout=self.timeout_s), None
            except grpc.RpcError as exc:
                answer, error = None, exc.code().name
            recorder.answered(request, self.clock() - started, answer, error)

    def _open_loop(self, recorder: Recorder) -> None:
        """Open loop: each request sent at its Poisson arrival time; latency from that time, not the send."""
        pending: set[grpc.Future] = set()
        started = self.clock()
        for n, offset in enumerate(poisson_arrivals(self.rate, self.seed)):
            due = started + offset
            if self.stop.wait(max(0.0, due - self.clock())):
                break
            request = self.requests[n % len(self.requests)]
            future = self.call.future(request.payload, timeout=self.timeout_s)
            self.max_send_lag_s = max(self.max_send_lag_s, self.clock() - due)
            recorder.sent()
            pending.add(future)
            future.add_done_callback(lambda f, r=request, t=due: self._done(f, r, t, recorder, pending))
        self.unfinished = len(pending)
        recorder.close()
        for future in list(pending):
            future.cancel()

    def _done(self, future: grpc.Future, request: Request, due: float, recorder: Recorder, pending: set) -> None:
        latency = self.clock() - due
        pending.discard(future)
        if future.cancelled():
            return
        error = future.exception()
        if error is None:
            recorder.answered(request, latency, future.result(), None)
        else:
            recorder.answered(request, latency, None, error.code().name if hasattr(error, "code") else "UNKNOWN")


@dataclass(frozen=True)
class Measured:
    """One point's windows and whether the last 3 agreed."""

    windows: list[Window]
    stable: bool
    max_send_lag_s: float | None
    unfinished: int
    answers: list[tuple[Request, bytes]]  # kept for checking (empty when nothing is checked)

    @property
    def counted(self) -> list[Window]:
        """The windows the point reports: the last 3 (the stable ones, when stable)."""
        return self.windows[-STABILITY_WINDOWS:]


def measure(load: Load, keep_answers: bool, window_s: float, max_windows: int, latency: str) -> Measured:
    """Windows of `window_s` while `load` runs, until stable or `max_windows`; then the load stops."""
    recorder = Recorder(keep_answers)
    threads = load.start(recorder)
    windows: list[Window] = []
    started = edge = time.perf_counter()
    try:
        while len(windows) < max_windows and not (windows and is_stable(windows, latency, load.rate is not None)):
            edge += window_s
            time.sleep(max(0.0, edge - time.perf_counter()))
            now = time.perf_counter()
            windows.append(recorder.take(now - started))
            started = now
    finally:
        recorder.close()
        load.stop.set()
        for thread in threads:
            thread.join(load.timeout_s + 5)
    stable = is_stable(windows, latency, load.rate is not None)
    lag = load.max_send_lag_s if load.rate is not None else None
    return Measured(windows, stable, lag, load.unfinished, recorder.answers)


@dataclass(frozen=True)
class Point:
    """One measured point of the sweep."""

    mode: str  # "concurrency" (closed loop) or "rate" (open loop)
    value: float  # workers, or requests/s
    batch_size: int
    window_s: float
    measured: Measured
    quality: object  # ClassificationMetrics / RegressionMetrics of the checked answers, or None
