"""One feature's captured traffic against its training distribution, over the training's bins: effect sizes
(trainserve.stats.divergence), what sampling noise alone would show at this sample size, the values that are not
numbers, and the verdict.

- PSI and the Jensen-Shannon distance over the bins (a category training never saw falls in one extra bin);
- the share of traffic values in such unseen categories;
- for numbers, the mean's shift in training standard deviations (which way, how far), and the NaN and infinite
  values of each side, counted as such (NaN in the missing bin, infinities in the outer bins);
- the noise allowance: the PSI (JS distance, unseen share) that undrifted samples of this many values exceed in
  1 % of draws. A feature has drifted when its PSI passes --max-psi plus that allowance, or its unseen share passes
  --max-unseen-share plus its own; it is "too few" to call stable when the allowance alone exceeds --max-psi.
Not p-values of "any difference": on a large capture those flag differences nobody would act on.
"""

from __future__ import annotations

import math

import numpy as np

from trainserve.data_profile import mean_sd
from trainserve.stats.divergence import js_distance, psi, sampling_noise, unseen_noise

UNSEEN = "<unseen>"


def compare(name: str, trained: dict, counted: dict) -> dict:
    """One feature's row of the drift table, before the thresholds (`judge`)."""
    if trained["kind"] == "numeric":
        expected, actual = np.asarray(trained["counts"], np.int64), np.asarray(counted["counts"], np.int64)
        extra, labels = _numeric(trained, counted, expected, actual), None
    else:
        known = trained["categories"]
        labels = [*known, UNSEEN]
        expected = np.array([*known.values(), 0], np.int64)
        seen = counted["categories"]
        unseen = {k: v for k, v in seen.items() if k not in known}
        actual = np.array([*(seen.get(k, 0) for k in known), sum(unseen.values())], np.int64)
        top_unseen = sorted(unseen.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
        extra = {
            "unseen_share": float(actual[-1] / actual.sum()) if actual.sum() else None,
            "top_unseen": [k for k, _ in top_unseen],
            "non_finite": None,
        }
    n = int(actual.sum())
    return {
        "feature": name,
        "kind": trained["kind"],
        "traffic_count": n,
        "psi": psi(expected, actual) if n else None,
        "js_distance": js_distance(expected, actual) if n else None,
        **extra,
        "noise": _noise(trained, expected, n),
        "bins": {"training": expected.tolist(), "traffic": actual.tolist(), "labels": labels},
    }


def _numeric(trained: dict, counted: dict, expected: np.ndarray, actual: np.ndarray) -> dict:
    mean_t, sd_t = mean_sd(trained)
    mean_a, _ = mean_sd(counted)
    shift = (mean_a - mean_t) / sd_t if sd_t > 0 else 0.0 if mean_a == mean_t else math.nan
    return {
        "mean_training": _finite(mean_t),
        "mean_traffic": _finite(mean_a),
        "mean_shift_sd": _finite(shift),
        "unseen_share": None,
        "edges": trained["edges"],
        "non_finite": {"training": _non_finite(trained, expected), "traffic": _non_finite(counted, actual)},
    }


def _finite(value: float) -> float | None:
    """None where a number is undefined (no finite values, no spread): JSON has no NaN."""
    return value if math.isfinite(value) else None


def _non_finite(state: dict, counts: np.ndarray) -> dict:
    """NaN values are the missing bin (the last); infinite ones are the binned values that are not finite."""
    nan = int(counts[-1])
    return {"nan": nan, "infinite": int(counts.sum()) - nan - int(state["count"])}


def _noise(trained: dict, expected: np.ndarray, n: int) -> dict | None:
    if not n:
        return None
    noise = sampling_noise(expected, n)
    unseen = None
    if trained["kind"] == "categorical":
        singletons = sum(1 for c in trained["categories"].values() if c == 1)
        unseen = unseen_noise(singletons, int(expected.sum()), n)
    return {
        "alpha": noise.alpha,
        "psi": noise.psi,
        "mean_psi": noise.mean_psi,
        "js_distance": noise.js_distance,
        "unseen_share": unseen,
    }


def judge(row: dict, max_psi: float, max_unseen_share: float) -> list[str]:
    """Set the row's thresholds (the flags' plus the noise allowance) and verdict; the reasons it drifted."""
    noise = row["noise"]
    if noise is None:
        row.update(psi_threshold=None, unseen_threshold=None, verdict="too few", drifted=False)
        return []
    reasons = []
    row["psi_threshold"] = max_psi + noise["psi"]
    if row["psi"] > row["psi_threshold"]:
        reasons.append(f"PSI {row['psi']:.3f} > {max_psi:g} + noise {noise['psi']:.3f}")
    row["unseen_threshold"] = None
    if row["unseen_share"] is not None:
        row["unseen_threshold"] = max_unseen_share + noise["unseen_share"]
        if row["unseen_share"] > row["unseen_threshold"]:
            reasons.append(
                f"unseen categories {row['unseen_share']:.1%} > {max_unseen_share:.1%}"
                + (f" + noise {noise['unseen_share']:.1%}" if noise["unseen_share"] else "")
            )
    row["drifted"] = bool(reasons)
    row["verdict"] = "drifted" if reasons else "too few" if noise["psi"] > max_psi else "stable"
    return reasons
