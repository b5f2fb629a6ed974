"""The three rollout steps. Each reads the config, checks everything, and only then rewrites it and
appends to the history; a refusal changes nothing, and neither does a candidate that fails to load.

    candidate: newest published version N -> loaded (policy gains N) -> AVAILABLE -> label candidate = N
    promote:   an eval report for N whose checks hold (rollout/checks.py) -> stable = N, previous = the old
               stable (kept loaded)
    rollback:  stable = previous; the rolled-back version unloads

While a progressive rollout of the model is in progress (trainserve.rollout.progress), each refuses: the rollout
owns the labels until it ends. The controller's own staging and promotion pass its START record (`rollout`).
With --routing-file, staging first routes the model with no share, and promote and rollback remove that route once
no candidate is labelled (trainserve.rollout.moves): requests naming no version stay on stable meanwhile.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from trainserve.errors import TrainserveError
from trainserve.evidence.decision import decide, gate_words
from trainserve.evidence.document import ReadReport, read_replay_report, read_report
from trainserve.files import locked, write_file_atomic
from trainserve.layout import numeric_versions
from trainserve.rollout import moves, staging_watch
from trainserve.rollout.checks import Refusal, refusals
from trainserve.rollout.config import CandidateConfig, PromoteConfig, RollbackConfig
from trainserve.rollout.config_file import find_model, history_path, new_config, read_config, write_config
from trainserve.rollout.history import append_history
from trainserve.rollout.labels import CANDIDATE, STABLE, Rollout, apply_rollout
from trainserve.rollout.progress import RolloutInProgress, refuse_during
from trainserve.rollout.prometheus import Prometheus
from trainserve.rollout.staging_watch import StagingHurtStable

log = logging.getLogger(__name__)


class Server(Protocol):
    """What the steps ask of the server (trainserve.client.ServingClient; a stand-in in unit tests)."""

    def wait_available(self, model: str, version: int, wait: float) -> None: ...

    def wait_label(self, model: str, label: str, version: int, wait: float) -> None: ...

    def wait_unloaded(self, model: str, version: int, wait: float) -> None: ...


class ReportChanged(TrainserveError):
    """The report a rollout began on is not the one at its path now: nothing is promoted on it."""


@dataclass(frozen=True)
class Change:
    """What a step did: the model, its labels before and after, and the history record written."""

    model: str
    before: Rollout
    after: Rollout
    record: dict | None
    skipped: str | None = None  # why nothing was done (--skip-during-rollout)

    def describe(self) -> str:
        if self.skipped:
            return self.skipped
        return f"model {self.model}: {self.after.describe()} (was: {self.before.describe()})"


def stage_candidate(
    config: CandidateConfig, server: Server, rollout: dict | None = None, prometheus: Prometheus | None = None
) -> Change:
    """Serve the newest published version (or --version) as `candidate`, `stable` untouched.

    Two writes, because TF Serving moves a label only to an AVAILABLE version: first the policy gains the
    version, then, once the server reports it AVAILABLE, the label follows. The lock is held throughout, so a
    rollout cannot begin in between. `rollout`: the START record of the rollout staging its own candidate. With
    --prometheus (or `prometheus`), stable's calls are watched while the version loads: a load that hurts them
    beyond --stage-* is unloaded and refused (trainserve.rollout.staging_watch).
    """
    config.check()
    path = config.config
    with locked(path):
        if not path.exists() and config.base_path is not None:
            write_config(path, new_config(config.model, config.base_path))
        served = read_config(path)
        model = find_model(served, path, config.model)
        before = Rollout.of(model)
        try:
            refuse_during(path, model.name, "candidate", rollout)
        except RolloutInProgress as exc:
            if not config.skip_during_rollout:
                raise
            log.info("nothing staged (--skip-during-rollout): %s", exc)
            return Change(model.name, before, before, None, skipped=f"nothing staged: {exc}")
        version = _version_to_stage(model, config.version, before)
        moves.route_before_staging(config, model.name, version, before)
        if before.candidate == version:
            log.info("model %s version %d is already the candidate", model.name, version)
            server.wait_label(model.name, CANDIDATE, version, config.wait)
            return Change(model.name, before, before, None)
        after = before.with_candidate(version)
        watching = staging_watch.watcher(
            _prometheus(config, prometheus), config.proxy_job, model.name, version, before.stable, config.stage
        )
        staging = _load_and_label(config, server, served, model, (before, after), watching)
        record = append_history(history_path(path), _record("candidate", model.name, before, after, staging=staging))
    return Change(model.name, before, after, record)


def _prometheus(config: CandidateConfig, given: Prometheus | None) -> Prometheus | None:
    return given if given is not None else Prometheus(config.prometheus) if config.prometheus else None


def _load_and_label(config: CandidateConfig, server: Server, served, model, labels: tuple, watching: tuple) -> dict:
    """The version loaded (the policy gains it), its load judged, then labelled; returns the history's `staging`
    record. A version that does not come up, or hurt stable while loading, leaves the config as it was."""
    (before, after), path, version = labels, config.config, labels[1].candidate
    original = path.read_bytes()
    apply_rollout(model, Rollout(before.stable, before.previous), loading=version)
    write_config(path, served)
    log.info("model %s: loading version %d (labels unchanged: %s)", model.name, version, before.describe())
    try:
        server.wait_available(model.name, version, config.wait)
        staging = staging_watch.judged(*watching, config.wait)
        apply_rollout(model, after)
        write_config(path, served)
        server.wait_label(model.name, CANDIDATE, version, config.wait)
    except StagingHurtStable as exc:
        _unload(config, server, model.name, version, original, before)
        append_history(
            history_path(path), _record("candidate", model.name, before, before, refused=str(exc), staging=exc.record)
        )
        raise
    except TrainserveError:
        # A candidate that did not come up leaves the config as it was, so the history tells all changes.
        write_file_atomic(path, original)
        log.info("model %s: config %s restored (labels: %s)", model.name, path, before.describe())
        raise
    return staging


def _unload(config: CandidateConfig, server: Server, model: str, version: int, original: bytes, labels) -> None:
    """The config as it was before the version loaded, and the version waited out of the server."""
    write_file_atomic(config.config, original)
    log.info(
        "model %s: config %s restored (labels: %s); unloading version %d",
        model,
        config.config,
        labels.describe(),
        version,
    )
    try:
        server.wait_unloaded(model, version, config.wait)
    except TrainserveError as exc:
        log.warning("model %s version %d: not seen unloaded: %s", model, version, exc)


def _version_to_stage(model, asked: int | None, current: Rollout) -> int:
    base = Path(model.base_path)
    on_disk = numeric_versions(base)
    if asked is not None:
        if asked not in on_disk:
            raise TrainserveError(f"model {model.name} version {asked} is not on disk under {base} (there: {on_disk})")
        return asked
    if not on_disk:
        raise TrainserveError(f"model {model.name}: no version published under {base} yet: expected `trainserve train`")
    newest = on_disk[-1]
    if current.stable is not None and newest <= current.stable:
        raise TrainserveError(
            f"model {model.name}: nothing new to stage: the newest version on disk ({newest}) is not newer than "
            f"stable ({current.stable})"
        )
    return newest


def promote(config: PromoteConfig, server: Server | None = None, rollout: dict | None = None) -> Change:
    """stable -> the candidate, when every check of its report holds (or is overridden, with a reason).
    `rollout`: the START record of the rollout promoting its candidate, whose report must be the bytes it began on."""
    config.check()
    read = read_report(config.report)
    replay = read_replay_report(config.replay) if config.replay is not None else None
    report = read.report
    path = config.config
    if rollout is not None and read.sha256 != rollout["report_sha256"]:
        raise ReportChanged(
            f"not promoted: the report {config.report} has SHA-256 {read.sha256[:12]}, not the "
            f"{rollout['report_sha256'][:12]} the rollout began on (rewritten since, e.g. by a retried eval): expected "
            "the bytes judged at the start"
        )
    with locked(path):
        served = read_config(path)
        model = find_model(served, path, report["model"])
        refuse_during(path, model.name, "promote", rollout)
        before = Rollout.of(model)
        version = _candidate_of(report, config, model, before)
        overridden = _judge(refusals(read, config, model.base_path, before, replay), config)
        if server is not None:  # reachable, and serving the candidate, before anything is rewritten
            server.wait_available(model.name, version, config.wait)
        after = before.promoted()
        apply_rollout(model, after)
        write_config(path, served)
        record = _record("promote", model.name, before, after, **_report_fields(read))
        if replay is not None:
            record["replay"] = _replay_fields(replay)
        record.update(overridden=overridden, reason=config.reason or None)
        entry = append_history(history_path(path), record)
    if server is not None:
        server.wait_label(model.name, STABLE, version, config.wait)
    moves.release_route(config.routing_file, model.name, after)
    return Change(model.name, before, after, entry)


def _candidate_of(report: dict, config: PromoteConfig, model, current: Rollout) -> int:
    """The candidate version the report is about; no override makes a report of another version count."""
    version = report["version"]
    if current.candidate is None:
        raise TrainserveError(
            f"model {model.name} has no candidate in {config.config}: expected `trainserve candidate` "
            f"first ({current.describe()})"
        )
    if version != current.candidate:
        raise TrainserveError(
            f"eval report {config.report} is for model {model.name} version {version}, but the candidate is "
            f"version {current.candidate}: expected a report of the candidate (trainserve eval --label candidate)"
        )
    if not (Path(model.base_path) / str(version)).is_dir():
        raise TrainserveError(f"model {model.name} version {version} is not on disk under {model.base_path}")
    return version


def _judge(found: list[Refusal], config: PromoteConfig) -> list[str]:
    """Refuse on the first check not overridden (each other one logged); returns the checks overridden."""
    blocking = [r for r in found if r.check not in config.override]
    if blocking:
        for refusal in blocking[1:]:
            log.error("also refused (%s): %s", refusal.check, refusal.said)
        raise TrainserveError(
            f"{blocking[0].said}: not promoted (--override {blocking[0].check} --reason TEXT promotes anyway)"
        )
    for refusal in found:
        log.warning("OVERRIDDEN (%s, reason: %s): %s", refusal.check, config.reason, refusal.said)
    return sorted({r.check for r in found})


def rollback(config: RollbackConfig, server: Server | None = None) -> Change:
    """stable -> previous stable (kept loaded since the last promotion)."""
    config.check()
    path = config.config
    with locked(path):
        served = read_config(path)
        model = find_model(served, path, config.model)
        refuse_during(path, model.name, "rollback")
        before = Rollout.of(model)
        after = before.rolled_back()
        apply_rollout(model, after)
        write_config(path, served)
        entry = append_history(history_path(path), _record("rollback", model.name, before, after, reason=config.reason))
    if server is not None:
        server.wait_label(model.name, STABLE, after.stable, config.wait)
    moves.release_route(config.routing_file, model.name, after)
    return Change(model.name, before, after, entry)


def _record(action: str, model: str, before: Rollout, after: Rollout, **extra) -> dict:
    return {"action": action, "model": model, "before": before.labels(), "after": after.labels(), **extra}


def _report_fields(read: ReadReport) -> dict:
    """Which report justified a promotion: its path, the SHA-256 of the bytes judged, what it proved."""
    report = read.report
    return {
        "report": str(read.path),
        "report_sha256": read.sha256,
        "report_created": report.get("created"),
        "report_label": report.get("label"),
        "accuracy": report.get("metrics", {}).get("accuracy"),
        "passed": decide(report).passed,
        "gates": [_gate_said(g) for g in report["gates"]],
        "verdict": (report.get("comparison") or {}).get("verdict_line"),
        "evidence": (report.get("evidence") or {}).get("kind"),
    }


def _replay_fields(read: ReadReport) -> dict:
    """Which replay stood beside the eval report: its path, digest, and the flip rate it showed."""
    flips = read.report.get("flips") or {}
    return {
        "report": str(read.path),
        "report_sha256": read.sha256,
        "flip_rate": flips.get("rate"),
        "flip_upper_bound": flips.get("upper_bound"),
        "gates": [g["said"] for g in read.report["gates"]],
    }


def _gate_said(gate: dict) -> str:
    """A gate in a few words, for the history: `accuracy >= 0.9: passed`."""
    return f"{gate_words(gate)}: {'passed' if gate.get('passed') else 'failed'}"
