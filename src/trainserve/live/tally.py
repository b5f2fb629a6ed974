"""Additive counts of scored answers, so that windows, slices and shards combine exactly: a `Cell` per version
and window, per version and slice value, and one per version overall (with its confusion matrix).

Regression cells keep, per error kind (squared, absolute), the sums of the per-example errors' first four powers:
MSE and MAE are their means, the skew-corrected interval of a mean (trainserve.stats.skewed_means: Hall's
transformation of Student's t) needs the first three and the gates' tail check (trainserve.stats.tails) the
fourth, so a window, a slice and a merged shard stay exact in bounded memory. RMSE's interval is the square root of
MSE's ends (the root is monotone)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from trainserve.class_scores import per_class
from trainserve.live.calibration import Calibration, estimate
from trainserve.stats.proportions import wilson_interval
from trainserve.stats.skewed_means import skewed_mean_interval

ERRORS = ("squared_error", "absolute_error")  # regression: per kind, the sums a cell keeps
SUMS = ("sum", "sum_sq", "sum_cu", "sum_qu")  # of the values and their squares, cubes and fourth powers
METRIC_OF = {"squared_error": "mse", "absolute_error": "mae"}


def empty_sums() -> dict[str, list[float]]:
    return {kind: [0.0] * len(SUMS) for kind in ERRORS}


def known_sums(values: list[float]) -> dict[str, float]:
    """The SUMS by name, without a fourth-power sum that a merged older report lacked (NaN)."""
    return {name: v for name, v in zip(SUMS, values) if not (name == "sum_qu" and math.isnan(v))}


def power_sums(values: np.ndarray) -> list[float]:
    """The SUMS of `values`: what a mean's skew-corrected interval and the gates' tail check need, and what a
    merge adds."""
    return [float(np.sum(values**power)) for power in (1, 2, 3, 4)]


@dataclass
class Cell:
    """Answers of one version in one window (or slice): `captured` every answer, `duplicates` those to an example
    the version had answered before, `examples` those scored against a label (the rest are unlabelled), `bins_*`
    the examples per calibration bin (each answered example once, and the scored ones)."""

    captured: int = 0
    duplicates: int = 0
    examples: int = 0
    correct: int = 0
    loss_sum: float = 0.0
    bins_all: np.ndarray | None = None
    bins_labelled: np.ndarray | None = None
    errors: dict[str, list[float]] | None = None  # regression: kind -> the SUMS

    @property
    def unlabelled(self) -> int:
        return self.captured - self.duplicates - self.examples

    def add(
        self, captured: int, duplicates: int, hits: np.ndarray, losses: np.ndarray, bins_all, bins_labelled, n_bins: int
    ) -> None:
        self.captured += captured
        self.duplicates += duplicates
        self.examples += len(hits)
        self.correct += int(hits.sum())
        self.loss_sum += float(losses.sum())
        if bins_all is not None:
            if self.bins_all is None:
                self.bins_all, self.bins_labelled = np.zeros(n_bins, np.int64), np.zeros(n_bins, np.int64)
            self.bins_all += np.bincount(bins_all, minlength=n_bins)
            self.bins_labelled += np.bincount(bins_labelled, minlength=n_bins)

    def add_errors(self, captured: int, duplicates: int, squared: np.ndarray) -> None:
        """Regression: `captured` answers, `duplicates` of them repeated, `squared` the squared errors of those
        scored (one target, so the absolute error is the root)."""
        self.captured += captured
        self.duplicates += duplicates
        self.examples += len(squared)
        self.loss_sum += float(squared.sum())
        self.errors = self.errors or empty_sums()
        for kind, values in (("squared_error", squared), ("absolute_error", np.sqrt(squared))):
            for i, added in enumerate(power_sums(values)):
                self.errors[kind][i] += added

    def merge(self, raw: dict) -> None:
        """Add a report's cell (its raw counts)."""
        if "errors" in raw:
            self.errors = self.errors or empty_sums()
            for kind in ERRORS:
                for i, name in enumerate(SUMS):
                    # a report from before the fourth-power sum: NaN, which the gates' tail check refuses
                    self.errors[kind][i] += raw["errors"][kind].get(name, math.nan)
        self.captured += raw["captured"]
        self.duplicates += raw["duplicates"]
        self.examples += raw["examples"]
        self.correct += raw["correct"]
        self.loss_sum += raw["loss_sum"]
        if raw["bins_all"] is not None:
            if self.bins_all is None:
                self.bins_all = np.zeros(len(raw["bins_all"]), np.int64)
                self.bins_labelled = np.zeros(len(raw["bins_all"]), np.int64)
            self.bins_all += np.asarray(raw["bins_all"], np.int64)
            self.bins_labelled += np.asarray(raw["bins_labelled"], np.int64)

    def _counts(self) -> dict:
        """Every answer is one of: duplicate, scored (examples), unlabelled."""
        return {
            "captured": self.captured,
            "duplicates": self.duplicates,
            "examples": self.examples,
            "unlabelled": self.unlabelled,
        }

    def to_json(self, calibration: Calibration | None, level: float, max_psi: float) -> dict:
        """Raw counts (what a merge adds) and what they say: accuracy with Wilson's interval, the loss, and the
        estimate over every answer and over the scored ones (so its error beside the realised accuracy shows)."""
        accuracy = self.correct / self.examples if self.examples else None
        cell = self._counts() | {
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
            cell["estimate"] = estimate(calibration, self.bins_all, level, max_psi)
            cell["estimate_labelled"] = estimate(calibration, self.bins_labelled, level, max_psi)
        return cell

    def regression_json(self, level: float) -> dict:
        """Raw sums and what they say: MSE, RMSE and MAE with skew-corrected intervals; no accuracy, no estimate."""
        n, sums = self.examples, self.errors or empty_sums()
        cell = self._counts() | {
            "correct": 0,
            "loss_sum": self.loss_sum,
            "bins_all": None,
            "bins_labelled": None,
            "accuracy": None,
            "interval": None,
            "loss": self.loss_sum / n if n else None,
            "estimate": None,
            "estimate_labelled": None,
            "errors": {kind: known_sums(values) for kind, values in sums.items()},
        }
        for kind, values in sums.items():
            metric = METRIC_OF[kind]
            cell[metric] = values[0] / n if n else None
            cell[f"{metric}_interval"] = skewed_mean_interval(n, *values[:3], level)
        mse, ends = cell["mse"], cell["mse_interval"]
        cell["rmse"] = None if mse is None else math.sqrt(mse)
        cell["rmse_interval"] = None if ends is None else [math.sqrt(max(e, 0.0)) for e in ends]
        return cell


@dataclass
class VersionTally:
    """Everything counted for one answering version."""

    version: int
    classes: int
    calibration: Calibration | None = None
    regression: bool = False
    records: int = 0
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

    def cell_json(self, cell: Cell, level: float, max_psi: float) -> dict:
        return cell.regression_json(level) if self.regression else cell.to_json(self.calibration, level, max_psi)

    def to_json(self, label_names: list[str], window_s: int | None, level: float, max_psi: float) -> dict:
        c, cal = self.overall, self.calibration
        return {
            "version": self.version,
            "records": self.records,
            "captured": c.captured,
            "joined": c.examples,
            "unlabelled": c.unlabelled,
            "duplicates": c.duplicates,
            "overall": self.cell_json(c, level, max_psi),
            "per_class": per_class(self.confusion, label_names),
            "confusion_matrix": self.confusion.tolist(),
            "windows": [
                {
                    "start": start,
                    "end": None if window_s is None else start + window_s,
                    **self.cell_json(cell, level, max_psi),
                }
                for start, cell in sorted(self.windows.items())
            ],
            "slices": {
                column: [
                    {"value": value, **self.cell_json(cell, level, max_psi)} for value, cell in sorted(cells.items())
                ]
                for column, cells in sorted(self.slices.items())
            },
            "calibration": None if cal is None else cal.to_json(),
        }
