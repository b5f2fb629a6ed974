"""The offline evidence a progressive rollout starts from: the candidate's eval report (and replay report), every
check `promote` makes holding (trainserve.rollout.checks), before anything moves."""

from __future__ import annotations

from trainserve.errors import TrainserveError
from trainserve.evidence.document import ReadReport, read_replay_report, read_report
from trainserve.rollout.checks import refusals
from trainserve.rollout.config import PromoteConfig, RolloutConfig
from trainserve.rollout.config_file import find_model, read_config
from trainserve.rollout.labels import Rollout


def evidence_of(config: RolloutConfig, model: str, labels: Rollout, version: int) -> ReadReport:
    """The candidate's eval report (and replay), every check promote makes holding; else one line, nothing moved."""
    read = read_report(config.report)
    replay = read_replay_report(config.replay) if config.replay is not None else None
    report = read.report
    if report["model"] != model or report["version"] != version:
        raise TrainserveError(
            f"eval report {config.report} is for model {report['model']} version {report['version']}: expected "
            f"model {model} version {version}"
        )
    promote_config = PromoteConfig(config.config, config.report, config.replay, server=config.server)
    base_path = find_model(read_config(config.config), config.config, model).base_path
    found = refusals(read, promote_config, base_path, labels, replay)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise TrainserveError(f"{found[0].said}{more}: rollout not started (promote would refuse it too)")
    return read


def offline_summary(read: ReadReport) -> dict:
    """What the offline evidence says that the live checks compare against, for the START record."""
    return {}
