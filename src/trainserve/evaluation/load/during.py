"""`trainserve load --during COMMAND`: what a version load (or a whole rollout step) costs the traffic already being
served. TF Serving users report a reload raising another model's p99 from 20 ms to over 100 ms
(tensorflow/serving#1866) and DEADLINE_EXCEEDED on other models while a large one loads (#881): whether rollouts
need a maintenance window is a measurement, made here.

One steady load on the target (its version pinned, as every point of the sweep is) runs for --before-s; then
COMMAND runs, while GetModelStatus is watched all along. `during` lasts from COMMAND's start until it has exited
and a version change has been seen and finished (a version's state changed since COMMAND started, and none is
START, LOADING or UNLOADING), or --settle-timeout-s passed; then the load goes on for --after-s. Every answer's
completion time and latency is kept, so the report (during_report.py) has before/during/after figures and a
timeline.
"""

from __future__ import annotations

import logging
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass

import grpc

from trainserve.client import ServingClient, Target
from trainserve.client.status import POLL_S, State
from trainserve.evaluation.load.config import LoadConfig
from trainserve.evaluation.load.during_report import build_during_report
from trainserve.evaluation.load.inputs import PREDICT_METHOD, LoadResult, build_inputs
from trainserve.evaluation.load.measure import Load

log = logging.getLogger(__name__)
TRANSITIONS = frozenset({"START", "LOADING", "UNLOADING"})


@dataclass(frozen=True)
class Answer:
    t_s: float  # when it completed, seconds since the load began
    latency_s: float
    error: str | None  # the gRPC code's name of a failed request


@dataclass(frozen=True)
class Phases:
    """When COMMAND ran and when `during` ended, in seconds since the load began."""

    argv: list[str]
    started_s: float
    exited_s: float
    exit_code: int
    end_s: float  # end of `during`
    settled: bool  # a version change was seen and finished before --settle-timeout-s
    stopped_s: float  # end of the load


class Timeline:
    """A Load's recorder that keeps every answer with its completion time (thread-safe)."""

    def __init__(self, clock=time.perf_counter):
        self.clock, self.t0 = clock, clock()
        self.answers: list[Answer] = []
        self._lock = threading.Lock()

    def now(self) -> float:
        return self.clock() - self.t0

    def sent(self) -> None:
        pass

    def answered(self, request, latency_s: float, answer, error: str | None) -> None:
        del request, answer
        with self._lock:
            self.answers.append(Answer(self.now(), latency_s, error))

    def close(self) -> None:
        pass


class VersionWatch:
    """GetModelStatus every POLL_S seconds on a thread: each version's state changes, timed."""

    def __init__(self, client: ServingClient, model: str, now):
        self.client, self.model, self.now = client, model, now
        self.states: dict[int, str] = {}
        self.events: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="version-watch")

    def start(self) -> None:
        self._look()  # the states before anything happens: the baseline, not events
        self.events.clear()
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            self._look()

    def _look(self) -> None:
        try:
            statuses = self.client.status.version_states(self.model)
        except grpc.RpcError:  # the server's answer is what is measured; a missed look is not
            return
        for status in statuses:
            state = State.Name(status.state)
            if self.states.get(status.version) != state:
                self.states[status.version] = state
                self.events.append({"t_s": self.now(), "version": status.version, "state": state})

    def changed_since(self, t_s: float) -> bool:
        return any(e["t_s"] >= t_s for e in list(self.events))

    def in_transition(self) -> bool:
        return any(state in TRANSITIONS for state in list(self.states.values()))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def run_during(config: LoadConfig) -> LoadResult:
    """The load with COMMAND in its middle; raises TrainserveError on bad input, before any Predict."""
    config.check()
    target = Target(config.model, config.version, config.label, config.signature)
    client = ServingClient(config.server, tls=config.tls, timeout=config.timeout, origin=config.origin)
    try:
        version = client.wait_until_available(target, config.wait)
        inputs = build_inputs(config, client, client.signature(target, version), target, version)
        load = Load(client.channel.unary_unary(PREDICT_METHOD), inputs.requests[config.batch_sizes[0]], config.timeout)
        load.concurrency = config.concurrency[0] if config.concurrency else None
        load.rate, load.seed = (config.rate[0] if config.rate else None), config.seed
        timeline = Timeline(load.clock)
        watch = VersionWatch(client, config.model, timeline.now)
        watch.start()
        threads = load.start(timeline)
        try:
            phases = _around_command(config, timeline, watch)
        finally:
            load.stop.set()
            for thread in threads:
                thread.join(config.timeout + 5)
            watch.stop()
    finally:
        client.close()
    report = build_during_report(config, version, inputs.data_name, timeline.answers, watch.events, phases)
    return LoadResult(report, phases.exit_code == 0 and phases.settled)


def _around_command(config: LoadConfig, timeline: Timeline, watch: VersionWatch) -> Phases:
    """--before-s of load, COMMAND, the wait for the versions to settle, --after-s of load."""
    argv = shlex.split(config.during)
    time.sleep(config.before_s)  # the load itself is the point of the wait: steady traffic before COMMAND
    started = timeline.now()
    log.info("during: running %s", shlex.join(argv))
    exit_code = subprocess.run(argv, check=False).returncode
    exited = timeline.now()
    deadline = time.monotonic() + config.settle_timeout_s
    settled = exit_code == 0
    while settled and not (watch.changed_since(started) and not watch.in_transition()):
        if time.monotonic() >= deadline:
            settled = False
            log.warning("during: no finished version change within --settle-timeout-s %g", config.settle_timeout_s)
        time.sleep(POLL_S)
    if exit_code != 0:
        log.error("during: %s exited %d", argv[0], exit_code)
    end = timeline.now()
    time.sleep(config.after_s)
    return Phases(argv, started, exited, exit_code, end, settled, timeline.now())
