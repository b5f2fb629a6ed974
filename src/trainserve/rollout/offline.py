"""The offline evidence a progressive rollout starts from: the candidate's eval report (and replay report), every
check `promote` makes holding (trainserve.rollout.checks), before anything moves."""

from __future__ import annotations

from pathlib import Path

from trainserve.errors import TrainserveError
from trainserve.evidence.document import ReadReport, read_replay_report, read_report
from trainserve.evidence.flips import flip_rate
from trainserve.rollout.checks import refusals
from trainserve.rollout.config import PromoteConfig
from trainserve.rollout.config_file import find_model, read_config
from trainserve.rollout.labels import Rollout
from trainserve.rollout.rollout_config import RolloutConfig


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


def offline_summary(read: ReadReport, replay: Path | None, stable: int, tolerance: float = 1.0) -> dict:
    """What the offline evidence says that the live checks compare against, for the START record: `disagreement`,
    the share of examples on which the candidate and `stable` disagree, which anchors the online flip budget
    (trainserve.rollout.analysis). Replay's flip rate when a replay report is given (top classes compared on
    captured traffic: what the shadow counts); else eval's discordant pairs (right in one version only), which are
    every disagreement between two classes and, beyond two, leave out the examples both get wrong differently
    (`both_wrong` says how many could be). Nothing when neither compared the candidate with `stable` on classes.
    A regression model's `difference` instead (difference_anchor), where a replay and the eval's baseline allow."""
    if read.report["task"]["kind"] == "regression":
        found = difference_anchor(read.report, read_replay_report(replay).report, tolerance) if replay else None
        return {"difference": found} if found and found["baseline"] == stable else {}
    found = _replay_disagreement(read_replay_report(replay).report) if replay is not None else None
    found = found or _eval_disagreement(read.report)
    if found is None or found["baseline"] != stable or found["candidate"] != read.report["version"]:
        return {}
    return {"disagreement": found}


def _replay_disagreement(report: dict) -> dict | None:
    if report.get("flips") is None:
        return None
    rate = flip_rate(report["tally"]["flip_matrix"], report["settings"]["alpha"])
    versions = {"candidate": report["candidate"]["version"], "baseline": report["baseline"]["version"]}
    return {"source": "replay", **versions, "count": rate.count, "examples": rate.examples}


def _eval_disagreement(report: dict) -> dict | None:
    comparison = report.get("comparison") or {}
    pairs = (comparison.get("test") or {}).get("discordant")
    if pairs is None:
        return None
    versions = {"candidate": comparison["candidate_version"], "baseline": comparison["baseline"]["version"]}
    count = pairs["candidate_only"] + pairs["baseline_only"]
    examples = count + pairs["both_right"] + pairs["both_wrong"]
    return {"source": "eval", **versions, "count": count, "examples": examples, "both_wrong": pairs["both_wrong"]}


# Replay's |difference| bins (trainserve.replay.tally, which rollout does not import): bin i is
# [LOW x RATIO^i, LOW x RATIO^(i+1)); a test keeps the two equal.
REPLAY_LOW, REPLAY_RATIO = 1e-9, 1.02


def upper_edge(index: int) -> float:
    """The upper edge of replay's |difference| bin `index`."""
    return REPLAY_LOW * REPLAY_RATIO ** (index + 1)


def difference_anchor(report: dict, replay: dict, multiple: float) -> dict | None:
    """A regression model's shadow tolerance and its anchor: `multiple` times stable's mean absolute error on the
    eval report's split (a difference as large as stable's own typical error, in the target's units whatever they
    are), and the share of replay's |candidate - stable| beyond it (its 2 % bins: a bin that holds the tolerance
    counts as beyond, so the anchor errs towards a larger budget). None without both."""
    stable_mae = ((report.get("comparison") or {}).get("baseline_metrics") or {}).get("mae")
    bins = (replay.get("tally") or {}).get("abs_difference_bins")
    if not stable_mae or bins is None or replay.get("regression_difference") is None:
        return None
    tolerance = multiple * stable_mae
    beyond = sum(int(n) for i, n in bins.items() if upper_edge(int(i)) > tolerance)
    return {
        "source": "replay",
        "what": "share beyond the tolerance",
        "candidate": replay["candidate"]["version"],
        "baseline": replay["baseline"]["version"],
        "tolerance": tolerance,
        "stable_mae": stable_mae,
        "count": beyond,
        "examples": sum(int(n) for n in bins.values()),
    }
