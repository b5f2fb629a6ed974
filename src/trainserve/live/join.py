"""The join: the capture streamed record by record, each answered example looked up among the labels by
(request id, row), scored where a label is found, counted where not. Memory is the labels' arrays plus one byte per
label and version (whether that version answered it, and rightly: the pairs and the duplicates), whatever the
capture's length.

Per version, each captured answer (every row of every record) is exactly one of: `duplicate` (an example, request id
and row, this version had answered before, labelled or not: a client's retry; only the first answer counts),
`joined` (scored) or `unlabelled`, in the version's row, every window's and every slice's alike, so they add up to
the answers; the label-free estimate counts each example once too. Recognising a retry of an unlabelled example
takes its key (8 bytes per unlabelled example and version, seen.SeenKeys). A label no version answered is
`labelled but not captured` (the request was not sampled, or its id is wrong). The same example answered by two
versions (shadowed traffic, a retry that reached another version) is a pair: the gates compare on pairs where
there are enough.

A regression model (one target) is joined the same way: its labels are numbers, its answers `predictions`, and
per label and version the join keeps the squared error (8 bytes; NaN: not answered), from which the pairs'
differences of squared and absolute errors are summed.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trainserve.errors import TrainserveError
from trainserve.live.answers import error_pair, input_values, predictions, probabilities, width
from trainserve.live.calibration import Calibration, calibrate_version, flag_calibration, read_answers
from trainserve.live.config import LiveEvalConfig, drop_margin
from trainserve.live.labels import (
    LabelTable,
    SliceCodes,
    example_key,
    read_header,
    read_labels,
    request_hash,
)
from trainserve.live.seen import SeenKeys
from trainserve.live.tally import VersionTally
from trainserve.splits import VERSIONS, read_version_record
from trainserve.task import Task
from trainserve.traffic.reader import CapturedRequest, ReadSummary, read_capture

log = logging.getLogger(__name__)
NOT_ANSWERED = -1


@dataclass
class Joined:
    """What one read of a capture against one labels file counted."""

    task: Task
    labels: LabelTable
    versions: dict[int, VersionTally] = field(default_factory=dict)
    # version -> per label: -1 not answered, 0 wrong, 1 right; regression: the squared error, NaN not answered
    answered: dict[int, np.ndarray] = field(default_factory=dict)
    unlabelled_seen: dict[int, SeenKeys] = field(default_factory=dict)  # version -> keys of unlabelled examples
    input_slices: dict[str, SliceCodes] = field(default_factory=dict)
    estimate_notes: dict[int, str] = field(default_factory=dict)  # version -> why it has no estimate
    reused: dict[int, dict] | None = None  # --calibrations: version -> calibration, read once
    since_s: int | None = None  # --since, resolved once (a duration counts back from the start of the run)
    before_since: int = 0  # this shard's records answered before it, not scored
    read: ReadSummary = field(default_factory=ReadSummary)

    @property
    def regression(self) -> bool:
        return self.task.kind == "regression"

    def labelled_not_captured(self) -> int:
        if not self.answered:
            return int(len(self.labels.keys))
        any_answer = np.any(np.stack([_was_answered(a) for a in self.answered.values()]), axis=0)
        return int(len(any_answer) - any_answer.sum())

    def pairs(self) -> list[dict]:
        """Every two versions' answers to the same labelled examples: how many, and who alone was right; for
        regression, the sums of the paired differences (first minus second) of squared and absolute errors."""
        out = []
        for first, second in itertools.combinations(sorted(self.answered), 2):
            a, b = self.answered[first], self.answered[second]
            both = _was_answered(a) & _was_answered(b)
            if self.regression:
                out.append(error_pair(first, second, a[both], b[both]))
                continue
            out.append(
                {
                    "versions": [first, second],
                    "examples": int(both.sum()),
                    "first_only": int(np.sum(both & (a == 1) & (b == 0))),
                    "second_only": int(np.sum(both & (a == 0) & (b == 1))),
                    "both_right": int(np.sum(both & (a == 1) & (b == 1))),
                }
            )
        return out


def _was_answered(answered: np.ndarray) -> np.ndarray:
    return ~np.isnan(answered) if answered.dtype.kind == "f" else answered != NOT_ANSWERED


def model_task(data_dir: Path | None, model: str, width: int) -> Task:
    """The task of the newest version recorded in `data_dir`; else `width` classes named by their index (two for
    one score: class 1's probability, as eval reads it)."""
    versions = Path(data_dir or ".") / model / VERSIONS
    numbers = sorted((int(p.stem) for p in versions.glob("*.json") if p.stem.isdigit()), reverse=True)
    for number in numbers:
        record = read_version_record(data_dir, model, number) or {}
        if (record.get("task") or {}).get("kind"):
            task = Task.from_json(record["task"])
            if task.kind == "regression" and task.targets != 1:
                raise TrainserveError(
                    f"model {model!r} predicts {task.targets} targets ({versions}/{number}.json): live-eval scores "
                    "a regression model of one target (one number per label)"
                )
            return task
    classes = max(width, 2)
    return Task("classification", classes=classes, label_names=tuple(str(i) for i in range(classes)))


def join_capture(config: LiveEvalConfig, captures: list[Path]) -> Joined:
    """Read the labels, then stream the capture past them (this shard's requests only)."""
    config.check()
    read = ReadSummary()
    records = read_capture(captures, config.model, None, read)
    first = next(records)
    task = model_task(config.data_dir, config.model, width(first))
    _check_task(config, task)
    header = read_header(config.labels)
    label_slices = tuple(s for s in config.slice if s in header)
    class_of = {name: i for i, name in enumerate(task.label_names)}
    labels = read_labels(
        config.labels,
        config.key,
        config.row_column,
        config.label_column,
        class_of,
        task.classes,
        label_slices,
        config.shard,
        regression=task.kind == "regression",
    )
    joined = Joined(task, labels, read=read)
    joined.input_slices = {s: SliceCodes(s) for s in config.slice if s not in header}
    since = joined.since_s = config.since_s()
    for record in itertools.chain([first], records):
        if config.shard is None or config.shard.takes(request_hash(record.request_id) % config.shard.count):
            if since is not None and record.timestamp_s < since:
                joined.before_since += 1
                continue
            _join_record(joined, config, record)
    if not joined.versions:
        log.warning("no captured request of this shard: nothing scored")
    return joined


def _check_task(config: LiveEvalConfig, task: Task) -> None:
    """One line for each flag that means nothing for this task, before the labels are read."""
    regression = task.kind == "regression"
    if regression and config.min_accuracy is not None:
        raise TrainserveError(
            "--min-accuracy: a regression model has no accuracy: expected --max-drop mse=X or mae=X against "
            "another version"
        )
    if regression and (config.model_base_path is not None or config.calibrations is not None):
        raise TrainserveError(
            "--model-base-path/--calibrations: the label-free estimate needs class probabilities (confidence): "
            "a regression model has none: expected neither"
        )
    if config.max_drop is not None:
        metric = drop_margin(config.max_drop).metric
        if regression != (metric != "accuracy"):
            expected = "mse=X or mae=X" if regression else "an accuracy drop (0.02 or accuracy=0.02)"
            raise TrainserveError(f"--max-drop {config.max_drop}: a {task.kind} model: expected {expected}")


def _side(joined: Joined, config: LiveEvalConfig, version: int) -> VersionTally:
    side = joined.versions.get(version)
    if side is None:
        calibration = _calibration(joined, config, version)
        side = joined.versions[version] = VersionTally(version, joined.task.classes, calibration, joined.regression)
        empty = (np.nan, np.float64) if joined.regression else (NOT_ANSWERED, np.int8)
        joined.answered[version] = np.full(len(joined.labels.keys), *empty)
        joined.unlabelled_seen[version] = SeenKeys()
    return side


def _calibration(joined: Joined, config: LiveEvalConfig, version: int) -> Calibration | None:
    if joined.regression:
        joined.estimate_notes[version] = "a regression model: no label-free estimate (it needs class probabilities)"
        return None
    if config.calibrations is not None:
        return _reused_calibration(joined, config, version)
    if config.model_base_path is None:
        joined.estimate_notes[version] = "no --model-base-path or --calibrations: no label-free estimate"
        return None
    try:
        return calibrate_version(config.data_dir, config.model, version, config.model_base_path, config.max_ece)
    except TrainserveError as exc:
        log.warning("version %d: no estimate: %s", version, exc)
        joined.estimate_notes[version] = str(exc)
        return None


def _reused_calibration(joined: Joined, config: LiveEvalConfig, version: int) -> Calibration | None:
    """The version's calibration from an earlier report, refitted for this run's --max-ece."""
    from trainserve.evidence.document import read_document
    from trainserve.live.report import SCHEMA_PATH

    if joined.reused is None:
        joined.reused = {
            s["version"]: s["calibration"]
            for s in read_document(config.calibrations, "live-eval", SCHEMA_PATH).report["versions"]
            if s["calibration"]
        }
    raw = joined.reused.get(version)
    if raw is None:
        joined.estimate_notes[version] = (
            f"--calibrations {config.calibrations} holds no calibration of version {version}"
        )
        log.warning("version %d: no estimate: %s", version, joined.estimate_notes[version])
        return None
    return flag_calibration(Calibration.from_json(raw), config.max_ece)


def _join_record(joined: Joined, config: LiveEvalConfig, record: CapturedRequest) -> None:
    side = _side(joined, config, record.version)
    side.records += 1
    if joined.regression:
        _join_regression(joined, config, record, side)
        return
    scores = probabilities(record)
    if scores.shape[1] != joined.task.classes and not (scores.shape[1] == 1 and joined.task.classes == 2):
        raise TrainserveError(
            f"request {record.request_id!r} (version {record.version}) answered {scores.shape[1]} probabilities: "
            f"expected {joined.task.classes} (the model's classes)"
        )
    log_p, confidence, predicted = read_answers(scores)
    n = len(predicted)
    found, duplicate = _lookup(joined, record, n)
    scored = (found >= 0) & ~duplicate
    at = found[scored]
    truth = joined.labels.labels[at]
    hits = predicted[scored] == truth
    joined.answered[record.version][at] = hits
    np.add.at(side.confusion, (truth, predicted[scored]), 1)
    losses = -log_p[scored][np.arange(len(at)), truth]  # eval's cross-entropy (probabilities clipped as Keras does)
    cal = side.calibration
    bins = cal.bins_of(confidence) if cal is not None else None
    n_bins = len(cal.counts) if cal is not None else 0

    def count(cell, rows: np.ndarray) -> None:
        """Add the record's answers `rows` (a mask over its n rows) to `cell`: the estimate counts each example once."""
        take = rows[scored]
        first = rows & ~duplicate
        cell.add(
            int(np.sum(rows)),
            int(np.sum(rows & duplicate)),
            hits[take],
            losses[take],
            None if bins is None else bins[first],
            None if bins is None else bins[rows & scored],
            n_bins,
        )

    _count_everywhere(joined, config, record, side, count, found)


def _lookup(joined: Joined, record: CapturedRequest, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(each row's label index or -1, the duplicate rows: examples this version had answered before, labelled or
    not). Remembers this record's unlabelled examples."""
    keys = np.fromiter((example_key(record.request_id, row) for row in range(n)), np.uint64, n)
    found = joined.labels.find(keys)
    labelled_before = np.zeros(n, bool)
    if len(joined.labels.keys):
        before = joined.answered[record.version][np.maximum(found, 0)]  # this record's rows: O(n), not O(labels)
        labelled_before = (found >= 0) & _was_answered(before)
    seen = joined.unlabelled_seen[record.version]
    unlabelled = found < 0
    unlabelled_before = unlabelled & seen.seen(keys)
    seen.add(keys[unlabelled & ~unlabelled_before])
    return found, labelled_before | unlabelled_before


def _join_regression(joined: Joined, config: LiveEvalConfig, record: CapturedRequest, side: VersionTally) -> None:
    """The regression join: the squared error of each scored row, counted per window and slice."""
    predicted = predictions(record)
    n = len(predicted)
    found, duplicate = _lookup(joined, record, n)
    scored = (found >= 0) & ~duplicate
    at = found[scored]
    squared = (predicted[scored] - joined.labels.labels[at]) ** 2
    joined.answered[record.version][at] = squared

    def count(cell, rows: np.ndarray) -> None:
        cell.add_errors(int(np.sum(rows)), int(np.sum(rows & duplicate)), squared[rows[scored]])

    _count_everywhere(joined, config, record, side, count, found)


def _count_everywhere(joined, config, record, side: VersionTally, count, found: np.ndarray) -> None:
    """`count` the record's rows into the version's overall cell, its window's and each slice value's. A labels-file
    column slices the labelled answers (a retry of a labelled example among them, as a duplicate)."""
    n = len(found)
    every = np.ones(n, bool)
    count(side.overall, every)
    every_s = config.window_s
    window = 0 if every_s is None else record.timestamp_s // every_s * every_s
    count(side.window(window), every)
    labelled = found >= 0
    for column, codes in joined.labels.slice_codes.items():
        values = np.full(n, -1, np.int32)
        values[labelled] = codes[found[labelled]]
        for code in np.unique(values[labelled]):
            count(side.slice_cell(column, joined.labels.slices[column].values[code]), values == code)
    for column, codes in joined.input_slices.items():
        values = input_values(record, column, n)
        for value in dict.fromkeys(values):
            count(side.slice_cell(column, codes.values[codes.code(value)]), values == value)
