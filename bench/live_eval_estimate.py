"""How well live-eval's label-free estimate (CBPE) tracks the realised accuracy when the traffic is harder than the
held-out split but the model's confidence still means what it meant (covariate shift, CBPE's assumption holds):
its bias and how often its stated 95 % error covers the window's realised accuracy, with the calibration map of
earlier releases (10 equal-count bins) beside the one it uses now (isotonic blocks). Then how often a window is
flagged for moved confidences: never-shifted windows (false flags), harder ones, and a window of the lowest
confidences alone (inverted images, say).

A synthetic ten-class model: each answer's top probability c, right with chance c (calibrated) or c^2
(over-confident); the held-out split's c = 1 - 0.85 * Beta(0.5, 10) (about 96 % accurate), harder traffic's
c = 1 - 0.85 * Beta(0.8, 4) (about 86 %). Seeded: the same numbers every run.

    python bench/live_eval_estimate.py [--draws 400] [--held-out 1000] [--window 300]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_live_eval_calibration import answers  # noqa: E402

from trainserve.live.calibration import (  # noqa: E402
    calibration_of,
    equal_count_bins,
    estimate,
    fit_calibration,
)

MAX_PSI = 0.25
TRAFFIC = {"like held-out": (0.5, 10.0), "a bit harder": (0.6, 8.0), "harder": (0.8, 4.0), "lowest only": (5.0, 1.2)}
TRUTH = {"calibrated": lambda c: c, "over-confident": lambda c: c**2}


def deciles(probabilities: np.ndarray, labels: np.ndarray):
    """The calibration of earlier releases: ten equal-count bins."""
    confidence, correct = probabilities.max(axis=1), probabilities.argmax(axis=1) == labels
    return calibration_of(1, equal_count_bins(confidence, correct), confidence, correct, 1.0, "deciles")


def run(rng, truth, traffic, draws: int, held_out: int, window: int) -> dict:
    said = {"deciles": [], "isotonic": []}
    for _ in range(draws):
        calibrating = answers(rng, held_out, TRAFFIC["like held-out"], truth)
        probabilities, labels = answers(rng, window, traffic, truth)
        realised = np.mean(labels == 0)
        for name, calibration in (
            ("deciles", deciles(*calibrating)),
            ("isotonic", fit_calibration(1, *calibrating, 1.0)),
        ):
            counts = np.bincount(calibration.bins_of(probabilities[:, 0]), minlength=len(calibration.counts))
            e = estimate(calibration, counts, 0.95, MAX_PSI)
            unwidened = e["error"] - (e["shift"]["moved"] if e["shift"]["flagged"] else 0.0)
            miss = abs(e["value"] - realised)
            said[name].append((e["value"] - realised, miss <= unwidened, miss <= e["error"], e["shift"]["flagged"]))
    return {name: np.array(rows) for name, rows in said.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=400, help="seeded held-out splits and windows per row")
    parser.add_argument("--held-out", type=int, default=1000, help="held-out examples the map is fitted on")
    parser.add_argument("--window", type=int, default=300, help="answers in a window")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"{args.draws} draws a row; held-out {args.held_out}, window {args.window}; 95 % stated error")
    print(f"{'truth':>15} {'traffic':>14} {'map':>9} {'bias':>7} {'coverage':>9} {'widened':>8} {'flagged':>8}")
    for truth_name, truth in TRUTH.items():
        for traffic_name, traffic in TRAFFIC.items():
            for name, rows in run(rng, truth, traffic, args.draws, args.held_out, args.window).items():
                bias, covered, widened, flagged = rows.mean(axis=0)
                row = f"{truth_name:>15} {traffic_name:>14} {name:>9} {100 * bias:>+6.2f}p"
                print(f"{row} {covered:>9.3f} {widened:>8.3f} {flagged:>8.3f}")


if __name__ == "__main__":
    main()
