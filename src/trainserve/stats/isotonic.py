"""Isotonic regression of a 0/1 outcome on a score, by pool-adjacent-violators (PAV), in numpy: the non-decreasing
step function closest (least squares) to the outcomes, read as blocks of consecutive scores with one mean each.
Checked in the tests against sklearn's IsotonicRegression."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Blocks(NamedTuple):
    """Consecutive score ranges: block b holds the scores up to `upper[b]`; `mean[b]` its outcomes' mean, `count[b]`
    how many, `score[b]` their mean score."""

    upper: np.ndarray
    mean: np.ndarray
    count: np.ndarray
    score: np.ndarray


def isotonic_blocks(score: np.ndarray, outcome: np.ndarray, min_count: int = 1) -> Blocks:
    """PAV's blocks of `outcome` on `score` (equal scores always share a block), then adjacent blocks of fewer than
    `min_count` joined (a join of neighbours keeps the means non-decreasing), so no block rests on a handful."""
    order = np.argsort(score, kind="stable")
    x, y = np.asarray(score, np.float64)[order], np.asarray(outcome, np.float64)[order]
    ties = np.r_[True, x[1:] != x[:-1]]  # each distinct score starts a group
    starts = np.flatnonzero(ties)
    sums, counts = np.add.reduceat(y, starts), np.diff(np.r_[starts, len(x)])
    scores, uppers = np.add.reduceat(x, starts), x[np.r_[starts[1:], len(x)] - 1]
    stack: list[list[float]] = []  # [sum, count, score sum, upper]
    for group in zip(sums, counts, scores, uppers):
        stack.append(list(group))
        while len(stack) > 1 and stack[-2][0] * stack[-1][1] >= stack[-1][0] * stack[-2][1]:
            _join_last_two(stack)
    joined: list[list[float]] = []
    for block in stack:
        if joined and joined[-1][1] < min_count:
            joined.append(block)
            _join_last_two(joined)
        else:
            joined.append(block)
    if len(joined) > 1 and joined[-1][1] < min_count:
        _join_last_two(joined)
    total, count, score_sum, upper = (np.array(column) for column in zip(*joined))
    return Blocks(upper, total / count, count.astype(np.int64), score_sum / count)


def _join_last_two(stack: list[list[float]]) -> None:
    last = stack.pop()
    stack[-1] = [stack[-1][0] + last[0], stack[-1][1] + last[1], stack[-1][2] + last[2], last[3]]
