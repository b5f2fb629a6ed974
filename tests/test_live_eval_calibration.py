"""The label-free estimate's calibration map and its flag, on a synthetic ten-class model whose confidence means
what it says: the isotonic blocks equal sklearn's isotonic regression; on harder traffic (CBPE's assumption still
holding) the estimate stays within a point of the realised accuracy where ten equal-count bins were 3-4 points high;
windows drawn like the held-out split are flagged at most 5 % of the time over seeds, windows of the lowest
confidences always, with the error widened to cover. bench/live_eval_estimate.py prints the full table."""

from __future__ import annotations

import numpy as np
import pytest

from trainserve.live.calibration import estimate, fit_calibration
from trainserve.stats.isotonic import isotonic_blocks

pytestmark = pytest.mark.unit
CLASSES = 10
LIKE_HELD_OUT, HARDER, LOWEST = (0.5, 10.0), (0.8, 4.0), (5.0, 1.2)  # Beta of 1 - confidence, scaled by 0.85


def answers(rng, n: int, beta: tuple[float, float], truth=lambda c: c) -> tuple[np.ndarray, np.ndarray]:
    """(probabilities, labels): class 0 on top with confidence c = 1 - 0.85 * Beta(beta), right with chance
    truth(c) (calibrated: c). bench/live_eval_estimate.py draws its model from here."""
    c = 1 - 0.85 * rng.beta(*beta, n)
    probabilities = np.empty((n, CLASSES))
    probabilities[:, 0] = c
    probabilities[:, 1:] = ((1 - c) / (CLASSES - 1))[:, None]
    return probabilities, np.where(rng.random(n) < truth(c), 0, 1)


def estimate_of(calibration, probabilities: np.ndarray) -> dict:
    counts = np.bincount(calibration.bins_of(probabilities.max(axis=1)), minlength=len(calibration.counts))
    return estimate(calibration, counts, 0.95, 0.25)


def test_isotonic_blocks_equal_sklearns_isotonic_regression():
    from sklearn.isotonic import IsotonicRegression

    rng = np.random.default_rng(0)
    score = np.round(rng.random(500), 2)  # ties: equal scores share a block
    outcome = (rng.random(500) < score).astype(float)
    blocks = isotonic_blocks(score, outcome)
    fitted = blocks.mean[np.searchsorted(blocks.upper, score)]
    reference = IsotonicRegression().fit(score, outcome).predict(score)
    assert fitted == pytest.approx(reference, abs=1e-12)
    assert np.all(np.diff(blocks.mean) > 0) and blocks.count.sum() == 500
    joined = isotonic_blocks(score, outcome, min_count=40)
    assert joined.count.min() >= 40 and np.all(np.diff(joined.mean) >= 0)
    assert np.sum(joined.mean * joined.count) == pytest.approx(outcome.sum())


def test_on_harder_traffic_the_estimate_follows_the_confidence_within_a_point():
    """Traffic about 86 % accurate against a 96 % held-out split: ten equal-count bins read 3.7 points high."""
    rng = np.random.default_rng(1)
    bias = []
    for _ in range(40):
        calibration = fit_calibration(1, *answers(rng, 1000, LIKE_HELD_OUT), max_ece=1.0)
        probabilities, labels = answers(rng, 300, HARDER)
        bias.append(estimate_of(calibration, probabilities)["value"] - np.mean(labels == 0))
    assert abs(np.mean(bias)) < 0.01, np.mean(bias)


def test_held_out_like_windows_are_rarely_flagged_and_the_lowest_confidences_always():
    rng = np.random.default_rng(2)
    false_flags, draws = 0, 100
    for i in range(draws):
        calibration = fit_calibration(1, *answers(rng, 1000, LIKE_HELD_OUT), max_ece=1.0)
        probabilities, _ = answers(rng, (50, 150, 500)[i % 3], LIKE_HELD_OUT)
        false_flags += estimate_of(calibration, probabilities)["shift"]["flagged"]
        if i % 10 == 0:  # a window of the lowest confidences (inverted images, say): flagged, and the error widened
            probabilities, labels = answers(rng, 150, LOWEST)
            said = estimate_of(calibration, probabilities)
            assert said["shift"]["flagged"] and said["shift"]["moved"] > 0.5, said
            low, high = said["interval"]
            assert low <= np.mean(labels == 0) <= high, said
    assert false_flags / draws <= 0.05, false_flags


@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_a_max_psi_that_is_no_positive_number_is_one_line(tmp_path, capsys, value):
    from trainserve.cli import main

    (tmp_path / "labels.csv").write_text("request_id,label\n")
    assert main(["live-eval", str(tmp_path), "--labels", str(tmp_path / "labels.csv"), "--max-psi", value]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and "--max-psi" in errors[0], errors
