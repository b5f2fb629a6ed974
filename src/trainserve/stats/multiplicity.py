"""Many tests at once (one per slice): p-values adjusted so that the family, not each test, keeps its error rate.

- Holm's step-down: the chance of calling any slice worse when none is stays at most alpha (family-wise error),
  whatever the dependence between the slices. The default.
- Benjamini-Hochberg: the expected share of false findings among the slices called worse stays at most alpha
  (false discovery rate); more power with many slices, for independent or positively dependent tests.

Each returns adjusted p-values in the input order: a slice is significant when its adjusted p is below alpha.
`adjusted_level` gives the level of each slice's interval that goes with them, so an interval and its adjusted
p-value never disagree about 0 the way an unadjusted interval beside an adjusted p does.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

METHODS = {"holm": "Holm's step-down (family-wise error)", "bh": "Benjamini-Hochberg (false discovery rate)"}


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values: sorted ascending, the i-th (from 0) times (m - i), made non-decreasing, capped at 1."""
    p = np.asarray(p_values, np.float64)
    m = p.size
    if not m:
        return []
    order = np.argsort(p, kind="stable")
    stepped = np.minimum(1.0, np.maximum.accumulate(p[order] * (m - np.arange(m))))
    adjusted = np.empty(m)
    adjusted[order] = stepped
    return adjusted.tolist()


def benjamini_hochberg(p_values: Sequence[float]) -> list[float]:
    """BH-adjusted p-values: sorted ascending, the i-th (from 1) times m / i, made non-decreasing from the
    largest down, capped at 1."""
    p = np.asarray(p_values, np.float64)
    m = p.size
    if not m:
        return []
    order = np.argsort(p, kind="stable")
    scaled = p[order] * m / np.arange(1, m + 1)
    stepped = np.minimum(1.0, np.minimum.accumulate(scaled[::-1])[::-1])
    adjusted = np.empty(m)
    adjusted[order] = stepped
    return adjusted.tolist()


def adjust(p_values: Sequence[float], method: str) -> list[float]:
    """`holm` or `bh`."""
    return {"holm": holm, "bh": benjamini_hochberg}[method](p_values)


def adjusted_level(adjusted: Sequence[float], alpha: float, method: str) -> float:
    """The confidence level of each member's interval that matches the family's adjusted p-values: Bonferroni's
    1 - alpha / m beside Holm (an interval excludes 0 only where Holm rejects), and beside Benjamini-Hochberg the
    false-coverage-rate level 1 - R alpha / m of Benjamini and Yekutieli (2005), R the members it rejects (at
    least 1). 1 - alpha for a family of one (or none)."""
    m = len(adjusted)
    if m <= 1:
        return 1 - alpha
    rejected = sum(p < alpha for p in adjusted) if method == "bh" else 1
    return 1 - max(rejected, 1) * alpha / m
