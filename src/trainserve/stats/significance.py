"""Tests of two versions judged on the same examples, in numpy and the standard library only (the eval image has
no scipy; the tests check each against scipy).

- McNemar's exact test: of the examples exactly one version gets right (the discordant pairs), how likely is a
  split at least this uneven if each were equally likely to be the one? A two-sided exact binomial test with
  p = 1/2 on b + c trials; the examples both get right or both get wrong say nothing about which is better.
- A paired sign-flip (randomization) test for per-example differences (regression errors). Its null hypothesis
  is that each example's difference is symmetric about 0 (as likely to be +d as -d), so the observed mean is
  compared with the means of randomly sign-flipped copies. That is more than "the mean difference is 0": a
  difference that is 0 on average but skewed (small gains on most examples, a few large losses) can be rejected,
  so a small p-value says the two versions' errors differ, and the sign of the mean says which way on average.
  Exact under its null (no normality needed: squared errors are heavy-tailed), seeded, Monte Carlo.
"""

from __future__ import annotations

import math

import numpy as np

EXACT_LIMIT = 5000  # discordant pairs up to which the binomial tail is summed in exact integers
FLIPS, CHUNK = 10000, 250


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact p-value of b against c discordant pairs (binomial, p = 1/2): twice the smaller tail."""
    n, k = b + c, min(b, c)
    if n == 0 or b == c:
        return 1.0
    if n <= EXACT_LIMIT:
        term, tail = 1, 1  # C(n, 0); each next term C(n, i) = C(n, i - 1) * (n - i + 1) / i, exactly
        for i in range(1, k + 1):
            term = term * (n - i + 1) // i
            tail += term
        return min(1.0, 2 * tail / 2**n)
    # Large n: the same sum in log space (lgamma), to double precision.
    i = np.arange(k + 1, dtype=np.float64)
    logs = math.lgamma(n + 1) - np.array([math.lgamma(x + 1) + math.lgamma(n - x + 1) for x in i]) - n * math.log(2)
    peak = logs.max()
    return min(1.0, 2 * math.exp(peak) * float(np.exp(logs - peak).sum()))


def sign_flip_test(differences: np.ndarray, flips: int = FLIPS, seed: int = 0) -> float:
    """Two-sided p-value of the null that each paired difference is symmetric about 0: the share of random sign
    flips whose mean is at least as far from 0 as the observed one, counting the observed arrangement itself
    ((1 + k) / (1 + flips))."""
    d = np.asarray(differences, np.float64)
    if not d.size or not np.any(d):
        return 1.0
    observed = abs(d.mean())
    rng = np.random.default_rng(seed)
    extreme = 0
    for start in range(0, flips, CHUNK):
        signs = rng.integers(0, 2, (min(CHUNK, flips - start), d.size), dtype=np.int8) * 2 - 1
        means = np.abs(signs @ d) / d.size
        extreme += int(np.sum(means >= observed * (1 - 1e-12)))  # ties (to rounding) count as extreme
    return (1 + extreme) / (1 + flips)
