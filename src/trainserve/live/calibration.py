"""The label-free estimate: confidence-based performance estimation (CBPE, as NannyML names it), for
classification with probabilities.

A version's accuracy on traffic it has answered, before any label arrives, is the mean over those answers of the
chance each one is right. The model's own confidence (its top probability) says that chance only when the model
is calibrated, so it is calibrated first, on the version's own held-out split: isotonic regression of being right on
the confidence (pool-adjacent-violators, trainserve.stats.isotonic) cuts the split into blocks of consecutive
confidences, each with the accuracy the version showed in it and at least 1/MAX_BLOCKS of the split
(MIN_BLOCK examples at least). The blocks follow the confidence itself: equal-count deciles put a tenth of a
96 %-accurate model's split in one lowest bin spanning confidence 0.30-0.86, so that on harder traffic, which
lands there, the estimate read that bin's average and came out high (bench/live_eval_estimate.py). The estimate
for a window is sum_b n_b a_b / n over the window's n answers, n_b of them in block b.

Its stated error (at --level) adds two variances: the window's own sampling (each answer right with chance a_b:
sum_b n_b a_b (1 - a_b) / n^2) and the calibration's (a_b itself measured on m_b held-out examples:
sum_b (n_b / n)^2 a_b (1 - a_b) / m_b). It assumes what CBPE assumes: the inputs may move, but the chance of being
right at a given confidence does not (no concept shift). The expected calibration error (ECE, over equal-count
deciles) of the raw confidences on the held-out split is reported; above --max-ece the estimate is flagged: the
model's confidence says little by itself and the estimate rests on the calibration map alone.

What it cannot judge, it says: a window whose answers' confidences are spread over the blocks unlike the held-out
split's (PSI above --max-psi and above what sampling alone reaches at 1 %, trainserve.stats.divergence) is
traffic the calibration has not seen (inverted images answered with low confidence, say): the chance of being right
at a given confidence is then exactly what may have changed. Such an estimate is flagged, and its error widened by
the share of answers that moved (half the sum of the share differences, the total variation distance): each of
those could be right or wrong.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainserve.class_scores import log_probabilities, output_kind
from trainserve.errors import TrainserveError
from trainserve.stats.distributions import two_sided_z
from trainserve.stats.divergence import psi, sampling_noise, shares
from trainserve.stats.isotonic import Blocks, isotonic_blocks

log = logging.getLogger(__name__)
ECE_BINS = 10  # the ECE's equal-count bins
MAX_BLOCKS, MIN_BLOCK = 100, 10  # each calibration block holds 1/MAX_BLOCKS of the split, MIN_BLOCK examples at least


@dataclass(frozen=True)
class Calibration:
    """One version's calibration map: bin b holds confidences in (edges[b-1], edges[b]]; `accuracy[b]` is what
    the version's held-out examples in it scored, `counts[b]` how many there were. (A report of an earlier release
    holds equal-count bins, read alike.)"""

    version: int
    edges: tuple[float, ...]
    accuracy: tuple[float, ...]
    confidence: tuple[float, ...]
    counts: tuple[int, ...]
    ece: float
    held_out_accuracy: float
    flagged: str | None  # why the estimate should not be trusted alone, or None
    method: str = "histogram binning of the top probability, equal-count bins"

    def bins_of(self, confidence: np.ndarray) -> np.ndarray:
        return np.searchsorted(np.asarray(self.edges), confidence, side="left")

    def to_json(self) -> dict:
        return {
            "version": self.version,
            "method": self.method,
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
            raw["method"],
        )


def read_answers(probabilities: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(log class probabilities, top probability, predicted class) of each row, from probabilities or logits as
    eval reads them (trainserve.class_scores)."""
    scores = probabilities.reshape(len(probabilities), -1)
    log_p = log_probabilities(scores, output_kind(scores, "probabilities"))
    predicted = log_p.argmax(axis=1)
    return log_p, np.exp(log_p[np.arange(len(log_p)), predicted]), predicted


def fit_calibration(version: int, probabilities: np.ndarray, labels: np.ndarray, max_ece: float) -> Calibration:
    """The calibration map of `version` from its held-out answers and labels: isotonic blocks."""
    _, confidence, predicted = read_answers(probabilities)
    correct = predicted == labels
    least = max(MIN_BLOCK, -(-len(correct) // MAX_BLOCKS))
    blocks = isotonic_blocks(confidence, correct, least) if len(correct) else Blocks(*([np.zeros(0)] * 4))
    method = f"isotonic regression (PAV) on the top probability, {len(blocks.count)} blocks of >= {least} examples"
    return calibration_of(version, blocks, confidence, correct, max_ece, method)


def equal_count_bins(confidence: np.ndarray, correct: np.ndarray, bins: int = ECE_BINS) -> Blocks:
    """The held-out answers in `bins` bins of equal count: each bin's accuracy and mean confidence."""
    inner = np.unique(np.quantile(confidence, np.arange(1, bins) / bins, method="lower"))
    inner = inner[inner < confidence.max()]  # a top edge at the maximum would leave an empty last bin
    where = np.searchsorted(inner, confidence, side="left")
    counts = np.bincount(where, minlength=len(inner) + 1)
    hits = np.bincount(where, weights=correct, minlength=len(inner) + 1)
    conf_sum = np.bincount(where, weights=confidence, minlength=len(inner) + 1)
    accuracy = np.divide(hits, counts, out=np.zeros(len(counts)), where=counts > 0)
    mean_conf = np.divide(conf_sum, counts, out=np.zeros(len(counts)), where=counts > 0)
    return Blocks(np.r_[inner, confidence.max()], accuracy, counts, mean_conf)


def calibration_of(
    version: int, blocks: Blocks, confidence: np.ndarray, correct: np.ndarray, max_ece: float, method: str
) -> Calibration:
    """The calibration with map `blocks`, its ECE over equal-count bins of the raw confidences."""
    deciles = equal_count_bins(confidence, correct) if len(correct) else Blocks(*([np.zeros(0)] * 4))
    ece = float(np.sum(deciles.count * np.abs(deciles.mean - deciles.score)) / max(len(correct), 1))
    calibration = Calibration(
        version,
        tuple(float(e) for e in blocks.upper[:-1]),
        tuple(float(a) for a in blocks.mean),
        tuple(float(c) for c in blocks.score),
        tuple(int(c) for c in blocks.count),
        ece,
        float(correct.mean()) if len(correct) else 0.0,
        None,
        method,
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


def estimate(calibration: Calibration, bin_counts, level: float, max_psi: float) -> dict | None:
    """The expected accuracy of answers counted into the calibration's bins, its stated error (half-width at
    `level`), and whether their confidences moved from the held-out split's (`shift`); None without answers."""
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
    shift = confidence_shift(calibration.counts, n_b, max_psi)
    error = two_sided_z(level) * math.sqrt(sampling + mapping) + (shift["moved"] if shift["flagged"] else 0.0)
    return {
        "value": value,
        "error": error,
        "interval": [max(0.0, value - error), min(1.0, value + error)],
        "shift": shift,
    }


def confidence_shift(held_out_counts, counts: np.ndarray, max_psi: float) -> dict:
    """How far the answers' confidences moved over the calibration's bins from the held-out split's: PSI, the
    threshold it is judged by (--max-psi, or what sampling alone reaches at 1 % where that is higher), the share
    of answers that moved (total variation distance), and whether the move is beyond the threshold."""
    said = psi(held_out_counts, counts)
    noise = sampling_noise(held_out_counts, int(counts.sum())).psi if len(counts) > 1 else 0.0
    threshold = max(max_psi, noise)
    moved = 0.5 * float(np.abs(shares(counts) - shares(held_out_counts)).sum())
    return {"psi": said, "threshold": threshold, "moved": moved, "flagged": bool(said > threshold)}


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
