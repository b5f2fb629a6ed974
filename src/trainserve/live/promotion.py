"""What the watch reads of the serving config and its history (both written by trainserve.rollout, which the live
stage does not import): the model's `stable` version, the history's record of the promotion that made it stable,
and the baseline that promotion was judged on."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from trainserve.errors import TrainserveError
from trainserve.live.sequential import Baseline
from trainserve.model_server_config import parse_model_config

STABLE = "stable"  # the version label TF Serving routes stable traffic by


def history_of(config: Path) -> Path:
    """The rollout history beside a serving config, as `trainserve candidate/promote/rollback` append it."""
    return config.with_name(config.name + ".history.jsonl")


def stable_promotion(path: Path, model: str) -> tuple[int, dict]:
    """(the model's stable version, the history's record of the promotion that made it stable)."""
    if not path.is_file():
        raise TrainserveError(f"--config {path}: no such file: expected the serving config (models.config)")
    served = {m.name: m for m in parse_model_config(path).model_config_list.config}
    if model not in served:
        raise TrainserveError(f"--config {path} has no model {model!r} (--model): it serves {sorted(served)}")
    stable = served[model].version_labels.get(STABLE)
    if stable is None:
        raise TrainserveError(f"--config {path}: model {model} has no `stable` version: nothing to watch")
    history = history_of(path)
    lines = history.read_text().splitlines() if history.is_file() else []
    promotions = [
        record
        for record in map(json.loads, filter(str.strip, lines))
        if record.get("action") == "promote"
        and record.get("model") == model
        and record.get("after", {}).get(STABLE) == stable
    ]
    if not promotions:
        raise TrainserveError(
            f"--config {path}: its history holds no promotion of {model} version {stable}: expected one (trainserve "
            "promote, or a rollout): the watch compares with what the version was promoted on"
        )
    return stable, promotions[-1]


def baseline_of(promotion: dict, against: str) -> Baseline:
    """The baseline from a promotion record: `previous` (the stable it replaced), or the held-out accuracy of the
    eval report it used, with that report's count of examples when the report is still there, unchanged."""
    if against == "previous":
        previous = promotion["before"].get(STABLE)
        if previous is None:
            raise TrainserveError(
                f"--watch-against previous: version {promotion['after'][STABLE]} was the first stable "
                "(no previous): expected --watch-against held-out"
            )
        return Baseline("previous", version=previous, source=f"promoted {promotion['time']}")
    accuracy = promotion.get("accuracy")
    if accuracy is None:
        raise TrainserveError(
            f"--state: the report version {promotion['after'][STABLE]} was promoted on states no accuracy "
            "(a regression model?): the watch judges a classifier's accuracy"
        )
    report = Path(promotion.get("report") or "")
    if not report.is_file() or hashlib.sha256(report.read_bytes()).hexdigest() != promotion.get("report_sha256"):
        return Baseline("held-out", accuracy, source=f"eval report {report} is no longer there as promoted")
    examples = json.loads(report.read_text())["data"]["examples"]
    return Baseline("held-out", accuracy, round(accuracy * examples), examples, source=f"eval report {report}")
