"""The label-free estimate: confidence-based performance estimation (CBPE, as NannyML names it), for
classification with probabilities.

A version's accuracy on traffic it has answered, before any label arrives, is the mean over those answers of the
chance each one is right. The model's own confidence (its top probability) says that chance only when the model
is calibrated, so it is calibrated first, on the version's own held-out split: the split's confidences are cut into
BINS bins of equal count, and each bin's confidence becomes the accuracy the version showed in it (histogram
binning). The estimate for a window is then sum_b n_b a_b / n over the window's n answers, n_b of them in bin b.

Its stated error (at --level) adds two variances: the window's own sampling (each answer right with chance a_b:
sum_b n_b a_b (1 - a_b) / n^2) and the calibration's (a_b itself measured on m_b held-out examples:
sum_b (n_b / n)^2 a_b (1 - a_b) / m_b). It assumes what CBPE assumes: the inputs may move, but the chance of being
right at a given confidence does not (no concept shift). The expected calibration error (ECE) of the raw
confidences on the held-out split is reported; above --max-ece the estimate is flagged: the model's confidence
says little by itself and the estimate rests on the calibration map alone.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainserve.errors import TrainserveError
from trainserve.evaluation.metrics import log_probabilities, output_kind
from trainserve.stats.distributions import two_sided_z

log = logging.getLogger(__name__)
BINS = 10


@dataclass(frozen=True)
class Calibration:
    """One version's calibration map: bin b holds confidences in (edges[b-1], edges[b]]; `accuracy[b]` is what
    the version's held-out examples in it scored, `counts[b]` how many there were."""

    version: int
    edges: tuple[float, ...]
    accuracy: tuple[float, ...]
    confidence: tuple[float, ...]
    counts: tuple[int, ...]
    ece: float
    held_out_accuracy: float
    flagged: str | None  # why the estimate should not be trusted alone, or None

    def bins_of(self, confidence: np.ndarray) -> np.ndarray:
        return np.searchsorted(np.asarray(self.edges), confidence, side="left")

    def to_json(self) -> dict:
        return {
            "version": self.version,
            "method": f"histogram binning of the top probability, {len(self.counts)} equal-count bins",
            "edges": list(self.edges),
            "accuracy": list(self.accuracy),
            "confidence": list(self.confidence),
            "counts": list(self.counts),
            "examples": int(sum(self.counts)),
            "ece": self.ece,
            "held_out_accuracy": self.held_out_accuracy,
            "flagged": self.flagged,
        }

    @classmethod
    def from_json(cls, raw: dict) -> Calibration:
        return cls(
            raw["version"],
            tuple(raw["edges"]),
            tuple(raw["accuracy"]),
            tuple(raw["confidence"]),
            tuple(raw["counts"]),
            raw["ece"],
            raw["held_out_accuracy"],
            raw["flagged"],
        )


def read_answers(probabilities: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(log class probabilities, top probability, predicted class) of each row, from probabilities or logits as
    eval reads them (trainserve.evaluation.metrics)."""
    scores = probabilities.reshape(len(probabilities), -1)
    log_p = log_probabilities(scores, output_kind(scores, "probabilities"))
    predicted = log_p.argmax(axis=1)
    return log_p, np.exp(log_p[np.arange(len(log_p)), predicted]), predicted


def fit_calibration(
    version: int, probabilities: np.ndarray, labels: np.ndarray, max_ece: float, bins: int = BINS
) -> Calibration:
    """The calibration map of `version` from its held-out answers and labels."""
    _, confidence, predicted = read_answers(probabilities)
    correct = predicted == labels
    inner = np.unique(np.quantile(confidence, np.arange(1, bins) / bins, method="lower"))
    inner = inner[inner < confidence.max()]  # a top edge at the maximum would leave an empty last bin
    where = np.searchsorted(inner, confidence, side="left")
    counts = np.bincount(where, minlength=len(inner) + 1)
    hits = np.bincount(where, weights=correct, minlength=len(inner) + 1)
    conf_sum = np.bincount(where, weights=confidence, minlength=len(inner) + 1)
    accuracy = np.divide(hits, counts, out=np.zeros(len(counts)), where=counts > 0)
    mean_conf = np.divide(conf_sum, counts, out=np.zeros(len(counts)), where=counts > 0)
    ece = float(np.sum(counts * np.abs(accuracy - mean_conf)) / max(len(labels), 1))
    calibration = Calibration(
        version,
        tuple(float(e) for e in inner),
        tuple(float(a) for a in accuracy),
        tuple(float(c) for c in mean_conf),
        tuple(int(c) for c in counts),
        ece,
        float(correct.mean()) if len(correct) else 0.0,
        None,
    )
    return flag_calibration(calibration, max_ece)


def flag_calibration(calibration: Calibration, max_ece: float) -> Calibration:
    """The calibration, flagged when the raw confidences' ECE on the held-out split exceeds `max_ece`."""
    flagged = None
    if calibration.ece > max_ece:
        flagged = (
            f"version {calibration.version}'s confidence is badly calibrated on its held-out split (ECE "
            f"{calibration.ece:.3f} > --max-ece {max_ece:g}): the estimate rests on the calibration map alone"
        )
    return dataclasses.replace(calibration, flagged=flagged)


def estimate(calibration: Calibration, bin_counts, level: float) -> dict | None:
    """The expected accuracy of answers counted into the calibration's bins, and its stated error (half-width at
    `level`); None without answers."""
    n_b = np.asarray(bin_counts, np.float64)
    n = n_b.sum()
    if n == 0:
        return None
    a = np.asarray(calibration.accuracy)
    m = np.asarray(calibration.counts, np.float64)
    # A bin's variance from its smoothed share: a bin all right (or all wrong) on the held-out split is not certain.
    smooth = (a * m + 0.5) / (m + 1)
    sampling = float(np.sum(n_b * smooth * (1 - smooth))) / n**2
    mapping = float(np.sum(np.divide((n_b / n) ** 2 * smooth * (1 - smooth), m, out=np.zeros_like(m), where=m > 0)))
    value = float(np.sum(n_b * a) / n)
    error = two_sided_z(level) * math.sqrt(sampling + mapping)
    return {"value": value, "error": error, "interval": [max(0.0, value - error), min(1.0, value + error)]}


def calibrate_version(
    data_dir: Path | None, model: str, version: int, model_base_path: Path, max_ece: float
) -> Calibration:
    """Run `version`'s SavedModel (in process, TensorFlow on CPU) over its held-out split, named by its record in
    `data_dir`, and fit the map. One error line when the record, the split or the version is missing."""
    from trainserve.layout import DEFAULT_SIGNATURE, SPLIT_INPUTS, SPLIT_LABELS, split_input_names
    from trainserve.savedmodel import LoadedModel
    from trainserve.splits import read_version_record, version_record_path

    record = read_version_record(data_dir, model, version)
    split = (record or {}).get("test_split") or {}
    if not split.get("file"):
        where = version_record_path(data_dir or Path("."), model, version)
        raise TrainserveError(
            f"--model-base-path: no held-out split recorded for version {version} ({where}): the estimate is "
            "calibrated on it; expected a version `trainserve train --data-dir` published"
        )
    version_dir = model_base_path / str(version)
    if not (version_dir / "saved_model.pb").is_file():
        raise TrainserveError(
            f"--model-base-path {model_base_path}: no version {version} (no {version_dir}/saved_model.pb)"
        )
    with np.load(Path(data_dir) / model / split["file"], allow_pickle=False) as npz:
        names = split_input_names(npz.files)
        inputs = {n: npz[f"{SPLIT_INPUTS}/{n}"] for n in names} if names else {None: npz[SPLIT_INPUTS]}
        labels = npz[SPLIT_LABELS].astype(np.int64).reshape(-1)
    recorded = (record or {}).get("signature")
    signature = recorded.get("name", DEFAULT_SIGNATURE) if isinstance(recorded, dict) else DEFAULT_SIGNATURE
    loaded = LoadedModel(version_dir)
    try:
        probabilities = _run_in_batches(loaded, signature, inputs, len(labels))
    finally:
        loaded.close()
    calibration = fit_calibration(version, probabilities, labels, max_ece)
    log.info(
        "version %d calibrated on %d held-out examples: ECE %.4f, accuracy %.4f",
        version,
        len(labels),
        calibration.ece,
        calibration.held_out_accuracy,
    )
    return calibration


def _run_in_batches(loaded, signature: str, inputs: dict, n: int, batch: int = 256) -> np.ndarray:
    """The version's probabilities over the n held-out examples, `batch` at a time; a split stored under one
    unnamed input feeds the signature's only input."""
    if None in inputs:
        wanted, _ = loaded.signature(signature)
        inputs = {next(iter(wanted)): inputs[None]}
    return np.concatenate(
        [
            loaded.run(signature, {k: v[start : start + batch] for k, v in inputs.items()}, ["probabilities"])[
                "probabilities"
            ]
            for start in range(0, n, batch)
        ]
    )
