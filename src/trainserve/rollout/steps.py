"""The three rollout steps. Each reads the config, checks everything, and only then rewrites it and
appends to the history; a refusal changes nothing, and neither does a candidate that fails to load.

    candidate: newest published version N -> loaded (policy gains N) -> AVAILABLE -> label candidate = N
    promote:   an eval report for N that passed -> stable = N, previous = the old stable (kept loaded)
    rollback:  stable = previous; the rolled-back version unloads
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from trainserve.errors import TrainserveError
from trainserve.files import write_file_atomic
from trainserve.layout import numeric_versions
from trainserve.rollout.config import CandidateConfig, PromoteConfig, RollbackConfig
from trainserve.rollout.config_file import find_model, history_path, locked, new_config, read_config, write_config
from trainserve.rollout.history import append_history
from trainserve.rollout.labels import CANDIDATE, STABLE, Rollout, apply_rollout

log = logging.getLogger(__name__)


class Server(Protocol):
    """What the steps ask of the server (trainserve.client.ServingClient; a stand-in in unit tests)."""

    def wait_available(self, model: str, version: int, wait: float) -> None: ...

    def wait_label(self, model: str, label: str, version: int, wait: float) -> None: ...


@dataclass(frozen=True)
class Change:
    """What a step did: the model, its labels before and after, and the history record written."""

    model: str
    before: Rollout
    after: Rollout
    record: dict | None

    def describe(self) -> str:
        return f"model {self.model}: {self.after.describe()} (was: {self.before.describe()})"


def stage_candidate(config: CandidateConfig, server: Server) -> Change:
    """Serve the newest published version (or --version) as `candidate`, `stable` untouched.

    Two writes, because TF Serving moves a label only to an AVAILABLE version: first the policy gains the
    version, then, once the server reports it AVAILABLE, the label follows. The lock is held throughout.
    """
    config.check()
    path = config.config
    with locked(path):
        if not path.exists() and config.base_path is not None:
            write_config(path, new_config(config.model, config.base_path))
        served = read_config(path)
        model = find_model(served, path, config.model)
        before = Rollout.of(model)
        version = _version_to_stage(model, config.version, before)
        if before.candidate == version:
            log.info("model %s version %d is already the candidate", model.name, version)
            server.wait_label(model.name, CANDIDATE, version, config.wait)
            return Change(model.name, before, before, None)
        after = before.with_candidate(version)
        original = path.read_bytes()
        apply_rollout(model, Rollout(before.stable, before.previous), loading=version)
        write_config(path, served)
        log.info("model %s: loading version %d (labels unchanged: %s)", model.name, version, before.describe())
        try:
            server.wait_available(model.name, version, config.wait)
            apply_rollout(model, after)
            write_config(path, served)
            server.wait_label(model.name, CANDIDATE, version, config.wait)
        except TrainserveError:
            # A candidate that did not come up leaves the config as it was, so the history tells all changes.
            write_file_atomic(path, original)
            log.info("model %s: config %s restored (labels: %s)", model.name, path, before.describe())
            raise
        record = append_history(history_path(path), _record("candidate", model.name, before, after))
    return Change(model.name, before, after, record)


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


def read_report(path: Path) -> dict:
    """An eval report, with the fields promote relies on."""
    try:
        report = json.loads(Path(path).read_text())
    except OSError as exc:
        raise TrainserveError(
            f"eval report {path} cannot be read ({exc.strerror}): expected an eval --report"
        ) from None
    except json.JSONDecodeError as exc:
        raise TrainserveError(f"eval report {path} is not JSON ({exc.msg}, line {exc.lineno})") from None
    missing = [k for k in ("model", "version", "passed") if not isinstance(report, dict) or k not in report]
    if missing:
        raise TrainserveError(f"eval report {path} has no {', '.join(missing)}: expected a trainserve eval report")
    return report


def promote(config: PromoteConfig, server: Server | None = None) -> Change:
    """stable -> the candidate, when the report is that candidate's and it passed (or --force)."""
    config.check()
    report = read_report(config.report)
    path = config.config
    with locked(path):
        served = read_config(path)
        model = find_model(served, path, None if report["model"] is None else str(report["model"]))
        before = Rollout.of(model)
        version = _check_report(report, config, model, before)
        if server is not None:  # reachable, and serving the candidate, before anything is rewritten
            server.wait_available(model.name, version, config.wait)
        after = before.promoted()
        apply_rollout(model, after)
        write_config(path, served)
        record = _record("promote", model.name, before, after, **_report_fields(config.report, report))
        record["forced"] = config.force
        entry = append_history(history_path(path), record)
    if server is not None:
        server.wait_label(model.name, STABLE, version, config.wait)
    return Change(model.name, before, after, entry)


def _check_report(report: dict, config: PromoteConfig, model, current: Rollout) -> int:
    """The candidate version the report vouches for; every refusal names what was expected."""
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
    if not report.get("gates"):
        # `all([])` is true: a report that judged nothing "passes"; no gate, no promotion.
        if not config.force:
            raise TrainserveError(
                f"eval report {config.report} applied no gate: expected trainserve eval with --min-accuracy, "
                "--require or --compare-with (--force promotes anyway, and says so in the history)"
            )
        log.warning("promoting model %s version %d on a report that applied no gate: --force", model.name, version)
    if not report["passed"]:
        why = _failed_gates(report)
        if not config.force:
            raise TrainserveError(
                f"eval report {config.report}: version {version} did not pass ({why}): not promoted "
                "(--force promotes anyway, and says so in the history)"
            )
        log.warning(
            "promoting model %s version %d although its evaluation FAILED (%s): --force",
            model.name,
            version,
            why,
        )
    return version


def _failed_gates(report: dict) -> str:
    """What failed, in the report's words: its gates, or accuracy against --min-accuracy."""
    gates = [g for g in report.get("gates") or [] if isinstance(g, dict) and not g.get("passed", True)]
    if gates:
        return "; ".join(f"{g.get('metric')} {g.get('value')} is not {g.get('op')} {g.get('threshold')}" for g in gates)
    accuracy = report.get("metrics", {}).get("accuracy")
    return (
        f"accuracy {accuracy} below --min-accuracy {report.get('min_accuracy')}" if accuracy is not None else "failed"
    )


def rollback(config: RollbackConfig, server: Server | None = None) -> Change:
    """stable -> previous stable (kept loaded since the last promotion)."""
    config.check()
    path = config.config
    with locked(path):
        served = read_config(path)
        model = find_model(served, path, config.model)
        before = Rollout.of(model)
        after = before.rolled_back()
        apply_rollout(model, after)
        write_config(path, served)
        entry = append_history(history_path(path), _record("rollback", model.name, before, after, reason=config.reason))
    if server is not None:
        server.wait_label(model.name, STABLE, after.stable, config.wait)
    return Change(model.name, before, after, entry)


def _record(action: str, model: str, before: Rollout, after: Rollout, **extra) -> dict:
    return {"action": action, "model": model, "before": before.labels(), "after": after.labels(), **extra}


def _report_fields(path: Path, report: dict) -> dict:
    """Which report justified a promotion: its path, digest, creation time, result."""
    return {
        "report": str(path),
        "report_sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest(),
        "report_created": report.get("created"),
        "report_label": report.get("label"),
        "accuracy": report.get("metrics", {}).get("accuracy"),
        "min_accuracy": report.get("min_accuracy"),
        "passed": report["passed"],
        "gates": [_gate_said(g) for g in report.get("gates") or [] if isinstance(g, dict)],
        "verdict": (report.get("comparison") or {}).get("verdict_line"),
        "data_matches_version": report.get("data_matches_version"),
    }


def _gate_said(gate: dict) -> str:
    """A gate in a few words, for the history: `accuracy >= 0.9: passed`."""
    said = f"{gate.get('metric')} {gate.get('op')} {gate.get('threshold')}"
    if gate.get("baseline_version") is not None:
        said += f" vs version {gate['baseline_version']}"
    return f"{said}: {'passed' if gate.get('passed') else 'failed'}"
