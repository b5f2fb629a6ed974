"""Effect sizes of a feature's traffic against its training distribution, over the training's bins.

- Population stability index: PSI = sum over bins of (a - e) ln(a / e), a and e the traffic's and training's
  shares; a share of 0 counts as EPSILON (else one empty bin makes it infinite). Read as < 0.1 stable, 0.1-0.25
  moderate, > 0.25 shifted.
- Jensen-Shannon distance (base 2): the square root of the JS divergence of the two shares, in [0, 1]; symmetric
  and finite with empty bins.
- The share of traffic values in a category training never saw (they fall in one extra bin in both measures).
- For numbers, the mean's shift in training standard deviations, which says which way and how far.
Not p-values: on a large capture a KS or chi-squared test flags differences nobody would act on.
"""

from __future__ import annotations

import math

import numpy as np

from trainserve.data_profile import mean_sd

EPSILON = 1e-4
UNSEEN = "<unseen>"


def psi(expected: np.ndarray, actual: np.ndarray) -> float:
    e, a = (np.maximum(_shares(x), EPSILON) for x in (expected, actual))
    return float(np.sum((a - e) * np.log(a / e)))


def js_distance(expected: np.ndarray, actual: np.ndarray) -> float:
    p, q = _shares(expected), _shares(actual)
    m = (p + q) / 2
    divergence = 0.5 * _kl(p, m) + 0.5 * _kl(q, m)
    return float(math.sqrt(max(0.0, divergence)))


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    held = p > 0
    return float(np.sum(p[held] * np.log2(p[held] / q[held])))


def _shares(counts) -> np.ndarray:
    counts = np.asarray(counts, np.float64)
    total = counts.sum()
    return counts / total if total else counts


def compare(name: str, trained: dict, counted: dict) -> dict:
    """One feature's row of the drift table."""
    if trained["kind"] == "numeric":
        expected, actual = np.asarray(trained["counts"]), np.asarray(counted["counts"])
        mean_t, sd_t = mean_sd(trained)
        mean_a, _ = mean_sd(counted)
        shift = (mean_a - mean_t) / sd_t if sd_t > 0 else (0.0 if mean_a == mean_t else math.inf)
        extra = {
            "mean_training": mean_t,
            "mean_traffic": mean_a,
            "mean_shift_sd": shift,
            "unseen_share": None,
            "edges": trained["edges"],
        }
        labels = None
    else:
        known = trained["categories"]
        seen = counted["categories"]
        labels = [*known, UNSEEN]
        expected = np.array([*known.values(), 0])
        unseen = {k: v for k, v in seen.items() if k not in known}
        actual = np.array([*(seen.get(k, 0) for k in known), sum(unseen.values())])
        total = max(1, int(actual.sum()))
        top_unseen = sorted(unseen.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
        extra = {"unseen_share": float(actual[-1] / total), "top_unseen": [k for k, _ in top_unseen]}
    return {
        "feature": name,
        "kind": trained["kind"],
        "traffic_count": int(np.asarray(actual).sum()),
        "psi": psi(expected, actual),
        "js_distance": js_distance(expected, actual),
        **extra,
        "bins": {"training": np.asarray(expected).tolist(), "traffic": np.asarray(actual).tolist(), "labels": labels},
    }
