"""`trainserve eval --compare-with VERSION|LABEL`: the evaluated version and a baseline, on the same examples.

The baseline is resolved and checked before any Predict: served (a version GetModelStatus lists, a label
GetModelMetadata resolves, as the rollout steps do: nothing serve-local-specific), not the evaluated version
itself, the same signature (inputs, outputs, dtypes, shapes) and the same class names. Then every batch goes to
both versions, pinned, both requests in flight together, so the comparison costs about the time of the slower
version rather than the sum of both; each answer is kept per example for the paired statistics (comparison.py).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np

from trainserve.client import ServingClient, Target
from trainserve.errors import TrainserveError
from trainserve.evaluation.comparison import per_example
from trainserve.evaluation.config import EvalConfig
from trainserve.evaluation.data import EvalData
from trainserve.evaluation.gates import check_change_gates
from trainserve.evaluation.metrics import task_metrics
from trainserve.evaluation.plan import Plan
from trainserve.evaluation.records import BatchAnswer, RunTotals, Tally
from trainserve.layout import LABEL_NAMES
from trainserve.model_server_config import parse_model_config

log = logging.getLogger(__name__)
Predict = Callable[[dict[str, np.ndarray], np.ndarray, int], BatchAnswer]


@dataclass(frozen=True)
class Baseline:
    """The version `--compare-with` names; None for a first rollout, with how that is known."""

    version: int | None
    first_rollout: str | None = None


def resolve_baseline(client: ServingClient, config: EvalConfig, target: Target, evaluated: int) -> Baseline:
    """The version `--compare-with` names, AVAILABLE. A label names none (a first rollout) only where the serving
    config says so (--allow-no-baseline with --rollout-config): a server that cannot answer for a label the
    config holds fails the eval with the server's own error, never a "first rollout"."""
    ref = config.compare_with
    if ref.isdigit():
        version = _served_version(client, config, target.model, int(ref))
    elif config.allow_no_baseline:  # config.check: with --rollout-config
        labelled = config_labels(config.rollout_config, target.model).get(ref)
        if labelled is None:
            return _first_rollout(client, config, target.model)
        client.wait_label(target.model, ref, labelled, config.wait)
        version = labelled
    else:
        seen = client.status.look_label(target.model, ref, may_appear=True)
        if seen.version is None:
            raise TrainserveError(
                f"--compare-with {ref}: {config.server} resolves no version for label {ref!r} of model "
                f"{target.model!r} ({seen.said}): expected a label it serves (a first rollout: --allow-no-baseline "
                "with --rollout-config, whose labels say that no stable exists yet)"
            )
        version = seen.version
    if version == evaluated:
        raise TrainserveError(f"--compare-with {ref} is version {version}, the version evaluated: expected another")
    return Baseline(version)


def _served_version(client: ServingClient, config: EvalConfig, model: str, version: int) -> int:
    try:
        served = sorted(s.version for s in client.status.version_states(model))
    except grpc.RpcError as exc:
        raise TrainserveError(
            f"--compare-with {version}: GetModelStatus for model {model!r}: {exc.details()}"
        ) from None
    if version not in served:
        raise TrainserveError(
            f"--compare-with {version}: model {model!r} has no version {version} on {config.server} (it has "
            f"{', '.join(map(str, served)) or 'none'}): expected a version or label this server serves"
        )
    client.wait_available(model, version, config.wait)
    return version


def _first_rollout(client: ServingClient, config: EvalConfig, model: str) -> Baseline:
    """No `ref` label in the serving config: the server must not resolve one either (else it reads another config)."""
    ref, path = config.compare_with, config.rollout_config
    seen = client.status.look_label(model, ref, may_appear=True)
    if seen.version is not None:
        raise TrainserveError(
            f"--compare-with {ref}: {config.server} resolves label {ref!r} to version {seen.version} but "
            f"{path} labels none: expected the config file this server reads (--rollout-config)"
        )
    said = f"{path} labels no {ref!r} version of model {model}: a first rollout, value gates decide"
    log.warning("--compare-with %s: %s", ref, said)
    return Baseline(None, said)


def config_labels(path: Path, model: str) -> dict[str, int]:
    """The version labels the serving config (the rollout steps' file) gives `model`."""
    config = parse_model_config(path)
    for entry in config.model_config_list.config:
        if entry.name == model:
            return dict(entry.version_labels)
    raise TrainserveError(f"--rollout-config {path} serves no model {model!r}: expected the config of this server")


def check_comparable(
    client: ServingClient, config: EvalConfig, target: Target, plan: Plan, data: EvalData, versions: tuple[int, int]
) -> None:
    """Same signature, same class names, change gates this task can judge: else one line, before any Predict."""
    reason = check_change_gates(config.require_vs_baseline, plan.task.kind)
    if reason:
        raise TrainserveError(reason)
    evaluated, baseline = (client.signature(target, v) for v in versions)
    for side in ("inputs", "outputs"):
        mine, theirs = getattr(evaluated, side), getattr(baseline, side)
        differing = sorted(k for k in mine.keys() | theirs.keys() if _spec(mine.get(k)) != _spec(theirs.get(k)))
        if differing:
            said = "; ".join(f"{k}: {_said(mine.get(k))} vs {_said(theirs.get(k))}" for k in differing)
            raise TrainserveError(
                f"--compare-with {config.compare_with}: signature {target.signature!r} of version {versions[0]} and "
                f"version {versions[1]} differ in {side} ({said}): expected two versions of one signature"
            )
    if LABEL_NAMES in evaluated.outputs and data.count:
        names = [_class_names(client, target, plan, data, v, config.retries) for v in versions]
        if names[0] != names[1]:
            raise TrainserveError(
                f"--compare-with {config.compare_with}: version {versions[0]} names its classes {names[0][:10]} and "
                f"version {versions[1]} {names[1][:10]}: expected the same classes in the same order"
            )


def _spec(spec) -> tuple | None:
    return None if spec is None else (spec.dtype, spec.shape)


def _said(spec) -> str:
    return "absent" if spec is None else spec.describe()


def _class_names(client, target: Target, plan: Plan, data: EvalData, version: int, retries: int) -> list[str]:
    """The `label_names` a version answers for one example (not an evaluated request)."""
    columns, _ = next(data.batches(1))
    answer = client.predict(target, plan.request_inputs(columns), [LABEL_NAMES], version, retries)
    return [v.decode() if isinstance(v, bytes) else str(v) for v in answer.outputs[LABEL_NAMES][0]]


class PairedRun:
    """Both versions' tallies, and per example what each got (accuracy, loss, errors...), in data order."""

    def __init__(self, plan: Plan, top_k: int, versions: tuple[int, int]):
        self.plan, self.versions = plan, versions
        self.tallies = tuple(Tally(plan, task_metrics(plan.task, top_k)) for _ in versions)
        self.values: dict[int, tuple[dict, dict]] = {}  # batch number -> (evaluated's, baseline's)

    def record(self, number: int, answers: tuple[BatchAnswer, BatchAnswer]) -> None:
        for version, answer in zip(self.versions, answers, strict=True):
            if answer.version != version:  # pinned requests name the version: anything else ignored the pin
                raise TrainserveError(f"server answered version {answer.version} to a request pinned to {version}")
        for tally, answer in zip(self.tallies, answers, strict=True):
            tally.add(answer)
        if any(a.nonfinite for a in answers):
            return  # not scored: the run is refused at its end
        self.values[number] = tuple(per_example(a, self.plan, t.quality) for a, t in zip(answers, self.tallies))

    def per_example(self, side: int) -> dict[str, np.ndarray]:
        """Each metric's per-example values of one side (0: evaluated, 1: baseline), in batch order."""
        ordered = [self.values[n][side] for n in sorted(self.values)]
        return {k: np.concatenate([v[k] for v in ordered]) for k in (ordered[0] if ordered else {})}


def run_paired(predict: Predict, data: EvalData, config: EvalConfig, run: PairedRun, progress: bool) -> float:
    """Every batch to both versions, both in flight together, up to --concurrency batches at once; returns the
    wall time. A failure of either ends the run (nothing not yet started is sent)."""
    import time

    from trainserve.terminal import progress_bar

    bar = progress_bar(data.count, "ex", f"compare {config.model}", progress)
    started = time.perf_counter()
    in_flight: deque = deque()
    with ThreadPoolExecutor(max_workers=2 * config.concurrency, thread_name_prefix="compare") as pool:
        try:
            for number, (x, y) in enumerate(data.batches(config.batch_size)):
                if len(in_flight) >= config.concurrency:
                    _finish(in_flight.popleft(), run, bar)
                in_flight.append((number, *(pool.submit(predict, x, y, v) for v in run.versions)))
            while in_flight:
                _finish(in_flight.popleft(), run, bar)
        except BaseException:
            for _, *futures in in_flight:
                for future in futures:
                    future.cancel()
            raise
        finally:
            bar.close()
    return time.perf_counter() - started


def _finish(entry, run: PairedRun, bar) -> None:
    number, evaluated, baseline = entry
    answers = (evaluated.result(), baseline.result())
    run.record(number, answers)
    bar.update(len(answers[0].labels))


def totals_of(run: PairedRun, wall_s: float) -> tuple[RunTotals, RunTotals]:
    return tuple(RunTotals(t, v, wall_s) for t, v in zip(run.tallies, run.versions, strict=True))  # type: ignore[return-value]
