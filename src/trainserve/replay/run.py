"""`trainserve replay`: the captured requests sent again, each to the candidate and to the baseline, both pinned
to the version their label named when the run began (a label moved mid-run cannot mix two models into one side),
both requests of a pair in flight together. No labels are needed: what is compared is the two answers.

The request is the captured PredictRequest itself (its inputs' bytes untouched), with its model spec pinned and
its output filter narrowed to the output compared. A pair one side fails is counted under that side's status code
and left out of the comparison; a captured request both refuse (a client's malformed request) is no difference.
Requests of another signature than the one replayed are skipped and counted.

Replay's own calls carry `x-trainserve-origin: replay`, so a capturing server leaves them out of its capture; the
capture is read as it was when the replay began (trainserve.traffic.reader), so even a capture that records them
neither grows the replay nor makes it endless. A server that stops answering (UNAVAILABLE, or DEADLINE_EXCEEDED
after the retries, for --unanswered pairs in a row) ends the replay with one line: its requests are sent without
waiting for a connection, so each costs its retries' backoff, not a deadline.
"""

from __future__ import annotations

import logging
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np

from trainserve.client import RequestFailed, ServingClient, Signature, Target
from trainserve.client.predict import Prediction, predict
from trainserve.errors import TrainserveError
from trainserve.evidence.flips import SIDES
from trainserve.layout import LABEL_NAMES
from trainserve.protos import predict_pb2
from trainserve.replay.config import ReplayConfig
from trainserve.replay.tally import ReplayTally
from trainserve.traffic.origin import REPLAY
from trainserve.traffic.reader import CapturedRequest, ReadSummary, read_capture

log = logging.getLogger(__name__)
UNANSWERED = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


@dataclass
class Plan:
    """Settled before the first replayed request."""

    versions: dict[str, int]  # side -> version
    signature: str
    output: str
    task: str  # classification | regression
    names_output: bool  # the signature answers label_names


@dataclass
class ReplayResult:
    config: ReplayConfig
    plan: Plan
    tally: ReplayTally
    capture: ReadSummary
    class_names: list[str]
    skipped_signature: int
    wall_s: float


def replay(config: ReplayConfig, captures: list[Path]) -> ReplayResult:
    """Replay `captures` against both versions; the tallies and what reading the capture found."""
    import time

    config.check()
    summary = ReadSummary()
    records = read_capture(captures, config.model, config.shard, summary)
    # A capture with nothing of this model fails here, before any connection; a shard may hold no record of it
    # (more shards than records): its report is empty and still merges.
    first = next(records, None)
    with ServingClient(config.server, tls=config.tls, timeout=config.timeout, origin=REPLAY) as client:
        plan = settle(client, config, config.signature_of(first.signature if first else ""))
        run = PairedReplay(client, config, plan)
        started = time.perf_counter()
        run.send_all(_limited(_chain(first, records), config.limit))
        wall = time.perf_counter() - started
    return ReplayResult(config, plan, run.tally, summary, run.class_names, run.skipped_signature, wall)


def _chain(first, rest):
    if first is not None:
        yield first
    yield from rest


def _limited(records, limit: int | None):
    for n, record in enumerate(records):
        if limit is not None and n >= limit:
            return
        yield record


def settle(client: ServingClient, config: ReplayConfig, signature: str) -> Plan:
    """Both versions AVAILABLE and different, the same signature, and the output and task compared."""
    judged = Target(config.model, version=config.version, label=config.label, signature=signature)
    ref = config.compare_with
    baseline = Target(config.model, version=int(ref), signature=signature) if ref.isdigit() else None
    baseline = baseline or Target(config.model, label=ref, signature=signature)
    versions = {side: client.wait_until_available(t, config.wait) for side, t in zip(SIDES, (judged, baseline))}
    if versions["candidate"] == versions["baseline"]:
        raise TrainserveError(
            f"{config.judged} and --compare-with {ref} are both version {versions['candidate']}: expected two versions"
        )
    signatures = [client.signature(judged, v) for v in versions.values()]
    output, task = _output_and_task(config, signatures[0])
    theirs = signatures[1].outputs.get(output)
    if theirs is None or (theirs.dtype, theirs.shape) != (
        signatures[0].outputs[output].dtype,
        signatures[0].outputs[output].shape,
    ):
        raise TrainserveError(
            f"output {output!r} of signature {signature!r}: version {versions['candidate']} has "
            f"{signatures[0].outputs[output].describe()}, version {versions['baseline']} "
            f"{'none' if theirs is None else theirs.describe()}: expected two versions of one signature"
        )
    names = all(LABEL_NAMES in s.outputs for s in signatures)
    log.info(
        "replaying %s: v%d (%s) vs v%d (%s), output %r (%s)",
        config.model,
        versions["candidate"],
        config.judged,
        versions["baseline"],
        ref,
        output,
        task,
    )
    return Plan(versions, signature, output, task, names)


def _output_and_task(config: ReplayConfig, signature: Signature) -> tuple[str, str]:
    outputs = signature.outputs
    if config.output is not None:
        output = config.output
    else:
        output = next((k for k in ("probabilities", "predictions") if k in outputs), None)
        floats = [k for k, v in outputs.items() if v.dtype.kind == "f"]
        output = output or (floats[0] if len(floats) == 1 else None)
    if output not in outputs:
        raise TrainserveError(
            f"signature answers no output {output!r} to compare: expected --output naming one of "
            f"{', '.join(sorted(outputs))}"
        )
    task = config.task if config.task != "auto" else "classification" if output == "probabilities" else "regression"
    if task == "classification" and (outputs[output].shape is None or len(outputs[output].shape) != 2):
        raise TrainserveError(
            f"output {output!r} is {outputs[output].describe()}: classification expects [N, K] scores"
        )
    return output, task


class PairedReplay:
    """Sends each record to both versions and adds the pair's answers to the tally."""

    def __init__(self, client: ServingClient, config: ReplayConfig, plan: Plan):
        self.client, self.config, self.plan = client, config, plan
        self.tally = ReplayTally(0)  # the classes are counted from the first answer compared
        self.class_names: list[str] = []
        self.skipped_signature = 0
        self.unanswered_in_row = 0

    def send_all(self, records) -> None:
        in_flight: deque = deque()
        with ThreadPoolExecutor(max_workers=2 * self.config.concurrency, thread_name_prefix="replay") as pool:
            for record in records:
                if record.signature != self.plan.signature:
                    self.skipped_signature += 1
                    continue
                if len(in_flight) >= self.config.concurrency:
                    self._finish(*in_flight.popleft())
                names = not self.class_names and self.plan.names_output and not in_flight
                in_flight.append([pool.submit(self._send, record, side, names) for side in SIDES])
                if names:  # the first pair alone: its answer names the classes
                    self._finish(*in_flight.popleft())
            while in_flight:
                self._finish(*in_flight.popleft())

    def _send(self, record: CapturedRequest, side: str, names: bool) -> Prediction | RequestFailed:
        request = predict_pb2.PredictRequest()
        request.CopyFrom(record.request)
        target = Target(self.config.model, signature=self.plan.signature)
        request.ClearField("model_spec")
        target.fill(request.model_spec, self.plan.versions[side])
        del request.output_filter[:]
        request.output_filter.extend([self.plan.output] + ([LABEL_NAMES] if names else []))
        try:
            return predict(
                self.client.prediction,
                request,
                target,
                self.plan.versions[side],
                self.config.retries,
                self.config.timeout,
                wait_for_ready=False,
            )
        except RequestFailed as failed:
            return failed

    def _finish(self, candidate: Future, baseline: Future) -> None:
        answers = {"candidate": candidate.result(), "baseline": baseline.result()}
        ok = {side: a for side, a in answers.items() if isinstance(a, Prediction)}
        failed = [a for a in answers.values() if isinstance(a, RequestFailed)]
        self._check_answering(failed)
        self.tally.requests += 1
        for side, answer in answers.items():
            if isinstance(answer, RequestFailed):
                self.tally.errors[side][answer.code.name] += 1
            else:
                self.tally.add_latency(side, answer.latency_s)
        if len(failed) == 2 and all(a.code == grpc.StatusCode.INVALID_ARGUMENT for a in failed):
            self.tally.refused_by_both += 1
        if len(ok) == 2:
            self._compare(ok["candidate"], ok["baseline"])

    def _check_answering(self, failed: list[RequestFailed]) -> None:
        """One line, and the end of the replay, once the server has not answered --unanswered pairs in a row: both
        sides UNAVAILABLE or DEADLINE_EXCEEDED (one side alone timing out is that version's error, not a gone one)."""
        gone = len(failed) == 2 and all(a.code in UNANSWERED for a in failed)
        self.unanswered_in_row = self.unanswered_in_row + 1 if gone else 0
        if self.unanswered_in_row >= self.config.unanswered:
            raise TrainserveError(
                f"{self.config.server} stopped answering: {self.unanswered_in_row} request pairs in a row failed "
                f"after {self.tally.requests} replayed ({failed[0]}): expected the server up for the whole replay"
            )

    def _compare(self, candidate: Prediction, baseline: Prediction) -> None:
        for side, answer in (("candidate", candidate), ("baseline", baseline)):
            if answer.version != self.plan.versions[side]:
                raise TrainserveError(
                    f"server answered version {answer.version} to a request pinned to {self.plan.versions[side]}"
                )
        if LABEL_NAMES in candidate.outputs and not self.class_names:
            self.class_names = [
                v.decode() if isinstance(v, bytes) else str(v) for v in candidate.outputs[LABEL_NAMES][0]
            ]
        c, b = (np.asarray(a.outputs[self.plan.output]) for a in (candidate, baseline))
        if c.shape != b.shape:
            raise TrainserveError(f"output {self.plan.output!r}: the versions answered shapes {c.shape} and {b.shape}")
        self.tally.paired += 1
        if self.plan.task == "classification":
            if not self.tally.classes:
                self.tally = ReplayTally(c.shape[-1], like=self.tally)
            if c.shape[-1] != self.tally.classes:
                raise TrainserveError(
                    f"output {self.plan.output!r}: {c.shape[-1]} scores, the first answer had {self.tally.classes}"
                )
            self.tally.add_classification(c, b)
        else:
            self.tally.add_regression(c, b)
