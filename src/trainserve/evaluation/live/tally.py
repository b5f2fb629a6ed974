"""Additive counts of scored answers, so that windows, slices and shards combine exactly: a `Cell` per version
and window, per version and slice value, and one per version overall (with its confusion matrix)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trainserve.evaluation.live.calibration import Calibration, estimate
from trainserve.evaluation.metrics import per_class
from trainserve.stats.proportions import wilson_interval


@dataclass
class Cell:
    """Answers of one version in one window (or slice): `captured` every answered example, `examples` those
    scored against a label, `bins_*` the answers per calibration bin (all, and the scored ones)."""

    captured: int = 0
    examples: int = 0
    correct: int = 0
    loss_sum: float = 0.0
    bins_all: np.ndarray | None = None
    bins_labelled: np.ndarray | None = None

    def add(self, captured: int, hits: np.ndarray, losses: np.ndarray, bins_all, bins_labelled, n_bins: int) -> None:
        self.captured += captured
        self.examples += len(hits)
        self.correct += int(hits.sum())
        self.loss_sum += float(losses.sum())
        if bins_all is not None:
            if self.bins_all is None:
                self.bins_all, self.bins_labelled = np.zeros(n_bins, np.int64), np.zeros(n_bins, np.int64)
            self.bins_all += np.bincount(bins_all, minlength=n_bins)
            self.bins_labelled += np.bincount(bins_labelled, minlength=n_bins)

    def merge(self, raw: dict) -> None:
        """Add a report's cell (its raw counts)."""
        self.captured += raw["captured"]
        self.examples += raw["examples"]
        self.correct += raw["correct"]
        self.loss_sum += raw["loss_sum"]
        if raw["bins_all"] is not None:
            if self.bins_all is None:
                self.bins_all = np.zeros(len(raw["bins_all"]), np.int64)
                self.bins_labelled = np.zeros(len(raw["bins_all"]), np.int64)
            self.bins_all += np.asarray(raw["bins_all"], np.int64)
            self.bins_labelled += np.asarray(raw["bins_labelled"], np.int64)

    def to_json(self, calibration: Calibration | None, level: float) -> dict:
        """Raw counts (what a merge adds) and what they say: accuracy with Wilson's interval, the loss, and the
        estimate over every answer and over the scored ones (so its error beside the realised accuracy shows)."""
        accuracy = self.correct / self.examples if self.examples else None
        cell = {
            "captured": self.captured,
            "examples": self.examples,
            "correct": self.correct,
            "loss_sum": self.loss_sum,
            "bins_all": None if self.bins_all is None else self.bins_all.tolist(),
            "bins_labelled": None if self.bins_labelled is None else self.bins_labelled.tolist(),
            "accuracy": accuracy,
            "interval": list(wilson_interval(self.correct, self.examples, level)) if self.examples else None,
            "loss": self.loss_sum / self.examples if self.examples else None,
            "estimate": None,
            "estimate_labelled": None,
        }
        if calibration is not None and self.bins_all is not None:
            cell["estimate"] = estimate(calibration, self.bins_all, level)
            cell["estimate_labelled"] = estimate(calibration, self.bins_labelled, level)
        return cell


@dataclass
class VersionTally:
    """Everything counted for one answering version."""

    version: int
    classes: int
    calibration: Calibration | None = None
    records: int = 0
    duplicates: int = 0  # answers to an example this version had already answered (not scored again)
    overall: Cell = field(default_factory=Cell)
    windows: dict[int, Cell] = field(default_factory=dict)  # window start (UTC seconds) -> cell
    slices: dict[str, dict[str, Cell]] = field(default_factory=dict)  # column -> value -> cell
    confusion: np.ndarray = field(init=False)

    def __post_init__(self):
        self.confusion = np.zeros((self.classes, self.classes), np.int64)

    def window(self, start: int) -> Cell:
        return self.windows.setdefault(start, Cell())

    def slice_cell(self, column: str, value: str) -> Cell:
        return self.slices.setdefault(column, {}).setdefault(value, Cell())

    def to_json(self, label_names: list[str], window_s: int | None, level: float) -> dict:
        c, cal = self.overall, self.calibration
        return {
            "version": self.version,
            "records": self.records,
            "captured": c.captured,
            "joined": c.examples,
            "unlabelled": c.captured - c.examples - self.duplicates,
            "duplicates": self.duplicates,
            "overall": c.to_json(cal, level),
            "per_class": per_class(self.confusion, label_names),
            "confusion_matrix": self.confusion.tolist(),
            "windows": [
                {"start": start, "end": None if window_s is None else start + window_s, **cell.to_json(cal, level)}
                for start, cell in sorted(self.windows.items())
            ],
            "slices": {
                column: [{"value": value, **cell.to_json(cal, level)} for value, cell in sorted(cells.items())]
                for column, cells in sorted(self.slices.items())
            },
            "calibration": None if cal is None else cal.to_json(),
        }
