"""Batched evaluation of a served model over gRPC: accuracy, loss, latency and throughput together.

Wait for the model -> read its signature -> check the data against it (before any Predict) -> the
first batch alone pins the version -> the rest with up to `concurrency` requests in flight ->
metrics, each example counted exactly once.
"""

from __future__ import annotations

import logging
import resource
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from trainserve.client import ServingClient, Target
from trainserve.errors import TrainserveError
from trainserve.evaluation.compare import PairedRun, check_comparable, resolve_baseline, run_paired, totals_of
from trainserve.evaluation.comparison import no_baseline, summarize
from trainserve.evaluation.config import EvalConfig, check_gates
from trainserve.evaluation.data import Batch, EvalData
from trainserve.evaluation.held_out import open_for_version
from trainserve.evaluation.metrics import predicted_classes, task_metrics
from trainserve.evaluation.noninferiority import check_margins
from trainserve.evaluation.plan import Plan, expected_kind, plan_requests, with_class_ids
from trainserve.evaluation.preflight import default_line, margins_for, observed_power, preflight
from trainserve.evaluation.proof import baseline_evidence, evidence_section
from trainserve.evaluation.records import BatchAnswer, EvalResult, FinishedRun, LocalComparison, RunTotals, Tally
from trainserve.evaluation.report import build_report
from trainserve.evaluation.slicing import slice_keys, slice_margin_problem
from trainserve.terminal import on_terminal, progress_bar

log = logging.getLogger(__name__)


def evaluate(config: EvalConfig, progress: bool | None = None) -> EvalResult:
    """Run the whole evaluation; raises TrainserveError with a one-line message on any failure."""
    config.check()
    start_rss = _current_rss_mb()
    target = Target(config.model, config.version, config.label, config.signature)
    client = ServingClient(config.server, tls=config.tls, timeout=config.timeout, origin="eval")
    show = on_terminal() if progress is None else progress
    paired = None
    try:
        # The version first: its own held-out split, and its record to check other data against.
        version = client.wait_until_available(target, config.wait)
        data, data_check, record = open_for_version(config, version)
        resolved = resolve_baseline(client, config, target, version) if config.compare_with else None
        baseline = resolved.version if resolved else None
        config, planned = _plan_comparison(config, data, baseline)  # before any Predict: margin, what n can show
        signature = client.signature(target, version)
        data = with_class_ids(client, target, signature, data, config.input_map, config.retries, version)
        plan, data = plan_requests(signature, data, target, config.task, config.output, config.input_map)
        check_gates(config.gates, plan.task)
        slices = _slices_of(config, plan, data)
        if baseline is not None:
            check_comparable(client, config, target, plan, data, (version, baseline))
        local_model = _local_model(config.compare_local)
        log.info(
            "evaluating %s on %s: %d examples of %s (%s, output %r), batches of %d, %d in flight%s",
            target.describe(),
            config.server,
            data.count,
            data.name,
            plan.task.kind,
            plan.output,
            config.batch_size,
            config.concurrency,
            f", each beside version {baseline}" if baseline else "",
        )
        predictor = _BatchPredictor(client, target, plan, config.retries, local_model)
        if baseline is None:
            totals = _run_batches(predictor, data, config, show, version)
        else:
            paired = PairedRun(plan, config.top_k, (version, baseline))
            totals, baseline_totals = totals_of(paired, run_paired(predictor.predict, data, config, paired, show))
    finally:
        client.close()
    refuse_nonfinite(plan, (totals,) if paired is None else (totals, baseline_totals))
    comparison = _comparison(config, paired, totals.version, resolved, slices)
    if comparison is not None and planned is not None and paired is not None:
        comparison["preflight"] = observed_power(planned, comparison)
    against = baseline_evidence(config, baseline, record, resolved.first_rollout, data) if resolved else None
    evidence = evidence_section(config, data_check, record, totals.tally.examples, against)
    finished = FinishedRun(config, data, plan, totals, start_rss, _peak_rss_mb(), data_check, comparison, evidence)
    report = build_report(finished)
    if report["metrics"].get("output_kind") == "logits":
        log.warning("output %r holds logits, not probabilities: loss and curves use their softmax", plan.output)
    latencies = [t * 1000 for t in totals.tally.latencies]
    return EvalResult(report, report["passed"], latencies, totals.tally, paired.tallies[1] if paired else None)


def _plan_comparison(config: EvalConfig, data: EvalData, baseline: int | None) -> tuple[EvalConfig, dict | None]:
    """The margins the comparison gates on (the default, said in one line, where --max-drop names none), and
    the pre-flight of what the data's examples can decide: a line when a margin is below it, a refusal with
    --require-power. Judged before any Predict; config returned with the margins it will apply. Nothing to plan
    without a baseline (no comparison, or a first rollout)."""
    if config.compare_with is None or baseline is None:
        return config, None
    kind = expected_kind(config.task, data)
    margins, default = margins_for(config.max_drop, kind, data.count, config.assume_discordance)
    planned = preflight(margins, data.count, config.assume_discordance, config.require_power, default)
    if default:
        rule = default_line(planned["default_margin"]) if planned else f"default margin {margins[0].describe()}"
        log.info("no --max-drop: gating on the %s (non-inferiority; --max-drop none: no margin)", rule)
    return replace(config, max_drop=margins), planned


def _slices_of(config: EvalConfig, plan: Plan, data: EvalData) -> list[tuple[str, np.ndarray]] | None:
    """--max-drop's metrics and --slice's columns checked before any Predict; each example's slice per --slice
    (None: the default slicing)."""
    reason = check_margins(config.max_drop or (), plan.task.kind) if config.compare_with else None
    reason = reason or (slice_margin_problem(config.max_drop_per_slice, plan.task, bool(config.slice)))
    if reason:
        raise TrainserveError(reason)
    if not config.slice:
        return None
    return [(",".join(spec), slice_keys(data, spec)) for spec in config.slice]


def _comparison(config: EvalConfig, paired: PairedRun | None, version: int | None, baseline, slices) -> dict | None:
    if config.compare_with is None:
        return None
    if paired is None:
        return no_baseline(config.compare_with, version, baseline.first_rollout)
    values = (paired.per_example(0), paired.per_example(1))
    tallies, versions = paired.tallies, paired.versions
    return summarize(
        config.compare_with,
        versions,
        tallies,
        values,
        config.alpha,
        config.seed,
        slices,
        config.slice_correction,
        config.max_drop_per_slice,
    )


def _local_model(version_dir: Path | None):
    if version_dir is None:
        return None
    from trainserve.savedmodel import LoadedModel

    return LoadedModel(version_dir)


def _current_rss_mb() -> float:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * resource.getpagesize() / 2**20
    except OSError:
        return 0.0


def _peak_rss_mb() -> float:
    """VmHWM: this process's peak RSS. (ru_maxrss survives exec, so it can report a parent's peak.)"""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass(frozen=True)
class _BatchPredictor:
    """Sends one batch and turns the answer into a BatchAnswer; called from the worker threads."""

    client: ServingClient
    target: Target
    plan: Plan
    retries: int
    local_model: object | None  # a trainserve.savedmodel.LoadedModel with --compare-local

    def predict(self, columns: dict[str, np.ndarray], labels: np.ndarray, version: int | None) -> BatchAnswer:
        inputs = self.plan.request_inputs(columns)
        prediction = self.client.predict(self.target, inputs, self.plan.output_filter, version, self.retries)
        output = prediction.outputs[self.plan.output]
        nonfinite = _nonfinite_examples(output)
        classes = prediction.outputs[self.plan.classes_output] if self.plan.classes_output else None
        local = None
        if self.local_model is not None:
            mine = self.local_model.run(self.target.signature, inputs, self.plan.output_filter)
            agreeing = None
            if self.plan.task.kind == "classification":
                agreeing = int(np.sum(_predicted(mine, self.plan) == _predicted(prediction.outputs, self.plan)))
            local = LocalComparison(float(np.max(np.abs(mine[self.plan.output] - output), initial=0.0)), agreeing)
        unknown = prediction.outputs[self.plan.unknown_output] if self.plan.unknown_output else None
        return BatchAnswer(
            prediction.version,
            labels,
            output,
            classes,
            prediction.latency_s,
            prediction.retries,
            local,
            unknown,
            nonfinite,
        )


def _nonfinite_examples(output: np.ndarray) -> int:
    """How many examples' output holds NaN or an infinity (such a batch is never scored: argmax would read NaN as
    class 0; the run is refused once it ends, naming how many)."""
    if output.dtype.kind not in "fc" or output.ndim == 0:
        return 0
    return int(np.count_nonzero(~np.isfinite(output.reshape(len(output), -1)).all(axis=1)))


def refuse_nonfinite(plan: Plan, totals: tuple[RunTotals, ...]) -> None:
    """One line when a version answered NaN or infinite outputs: what they would score means nothing."""
    for total in totals:
        if total.tally.nonfinite:
            raise TrainserveError(
                f"version {total.version} answered NaN or infinite {plan.output!r} for {total.tally.nonfinite} of "
                f"{total.tally.answered} examples: expected numbers (a diverged training?); nothing was scored"
            )


def _predicted(outputs: dict[str, np.ndarray], plan: Plan) -> np.ndarray:
    """Predicted classes: the served `classes` where the plan uses them, else the best score."""
    if plan.classes_output:
        return outputs[plan.classes_output]
    return predicted_classes(outputs[plan.output], plan.output)


def _run_batches(
    predictor: _BatchPredictor, data: EvalData, config: EvalConfig, show: bool, version: int | None = None
) -> RunTotals:
    """The first batch alone, then the rest concurrently, all pinned to the version that answered the first
    (the resolved `version`, where given)."""
    tally = Tally(predictor.plan, task_metrics(predictor.plan.task, config.top_k))
    pinned: int | None = None
    total = data.count if config.shard is None else None  # a shard's share is known only batch by batch
    bar = progress_bar(total, "ex", f"eval {predictor.target.model}", show)

    def record(answer: BatchAnswer) -> None:
        # Pinned requests name the version, so a different one means a server that ignored the pin.
        if pinned is not None and answer.version != pinned:
            raise TrainserveError(f"server answered version {answer.version} after pinning version {pinned}")
        tally.add(answer)
        bar.update(len(answer.labels))

    batches = data.batches(config.batch_size)
    if config.shard is not None:  # every N-th batch: shards of one data set, each example in exactly one
        batches = (batch for number, batch in enumerate(batches) if config.shard.takes(number))
    started = time.perf_counter()
    try:
        first = next(batches, None)
        if first is not None:
            # Alone: a version published mid-run must not mix into the metrics, so its answer pins the rest.
            answer = predictor.predict(*first, version=version)
            pinned = answer.version
            record(answer)
            _predict_concurrently(lambda x, y: predictor.predict(x, y, pinned), batches, config.concurrency, record)
    finally:
        bar.close()
    return RunTotals(tally, pinned, time.perf_counter() - started)


def _predict_concurrently(
    predict: Callable[[dict[str, np.ndarray], np.ndarray], BatchAnswer],
    batches: Iterator[Batch],
    concurrency: int,
    record: Callable[[BatchAnswer], None],
) -> None:
    """Keep up to `concurrency` batches in flight; `record` each answer in this thread as it arrives."""
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="eval") as pool:
        in_flight: set[Future] = set()
        try:
            for x, y in batches:
                if len(in_flight) >= concurrency:
                    done, in_flight = wait(in_flight, return_when=FIRST_COMPLETED)
                    for future in done:
                        record(future.result())
                in_flight.add(pool.submit(predict, x, y))
            for future in in_flight:
                record(future.result())
        except BaseException:
            for future in in_flight:  # a failure ends the run: send nothing that has not started
                future.cancel()
            raise
