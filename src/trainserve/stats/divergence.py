"""How far two distributions over the same bins are apart, and how far apart sampling noise alone puts them.

- Population stability index: PSI = sum over bins of (a - e) ln(a / e), a and e the two shares; a share of 0
  counts as EPSILON (else one empty bin makes it infinite). Read as < 0.1 stable, 0.1-0.25 moderate, > 0.25 shifted.
- Jensen-Shannon distance (base 2): the square root of the JS divergence of the two shares, in [0, 1]; symmetric
  and finite with empty bins.

Both are effect sizes, but measured on samples they are biased upward: two samples of one distribution differ bin
by bin by chance. Writing a = e + d, (a - e) ln(a / e) = d^2 / e + O(d^3), so PSI ~ sum d^2 / e, which is Pearson's
chi-squared statistic divided by the sample size: n * PSI ~ chi2(k - 1) for k bins of a sample of n against the
true shares, and PSI ~ chi2(k - 1) * (1/n + 1/m) when the reference is itself a sample of m. In expectation
(k - 1)(1/n + 1/m): 10 deciles, 50 requests -> 0.18 of pure noise. The approximation fails where it matters most,
on small samples: an empty traffic bin of share 0.1 adds 0.1 * ln(0.1 / EPSILON) = 0.69, not the 0.1 of the
chi-squared term. So the noise allowance is not the chi-squared quantile but the PSI's own quantile over seeded
draws of both samples from the reference shares (`sampling_noise`), exact for the statistic as defined, at any n.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

EPSILON = 1e-4
NOISE_ALPHA = 0.01  # the allowance is what undrifted samples exceed this rarely
NOISE_DRAWS = 2000  # simulated pairs of samples per allowance (the 99th percentile from 2,000: +-0.3 % in rank)
MIN_DRAWS = 200  # a profile with thousands of categories: fewer draws (each costs one binomial per bin)
_CELLS = 1_000_000  # draws x bins at most per allowance (under a second), and held at once (8 MB a side)


def shares(counts) -> np.ndarray:
    """Counts (the last axis) as shares of their total; all-zero counts stay zeros."""
    counts = np.asarray(counts, np.float64)
    total = counts.sum(axis=-1, keepdims=True)
    return np.divide(counts, total, out=np.zeros_like(counts), where=total > 0)


def psi(expected, actual) -> float:
    """The population stability index of `actual`'s counts against `expected`'s, over the same bins."""
    return float(_psi_rows(expected, actual))


def js_distance(expected, actual) -> float:
    """The Jensen-Shannon distance (base 2) of two count vectors over the same bins."""
    return float(_js_rows(expected, actual))


def _psi_rows(expected, actual) -> np.ndarray:
    e, a = (np.maximum(shares(x), EPSILON) for x in (expected, actual))
    return np.sum((a - e) * np.log(a / e), axis=-1)


def _js_rows(expected, actual) -> np.ndarray:
    p, q = shares(expected), shares(actual)
    m = (p + q) / 2
    divergence = 0.5 * _kl_rows(p, m) + 0.5 * _kl_rows(q, m)
    return np.sqrt(np.maximum(0.0, divergence))


def _kl_rows(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    held = p > 0
    ratio = np.divide(p, q, out=np.ones_like(p), where=held)
    return np.sum(np.where(held, p * np.log2(ratio), 0.0), axis=-1)


@dataclass(frozen=True)
class SamplingNoise:
    """What PSI and JS distance reach by chance alone between a reference sample of `reference` values and a
    sample of `sample` values, both drawn from the reference's shares: the (1 - alpha) quantile of each."""

    psi: float
    js_distance: float
    mean_psi: float
    alpha: float
    sample: int
    reference: int


def sampling_noise(
    reference_counts, sample: int, alpha: float = NOISE_ALPHA, draws: int = NOISE_DRAWS, seed: int = 0
) -> SamplingNoise:
    """PSI and JS distance of `draws` seeded pairs (reference', sample'), each a multinomial draw from the
    reference's shares of the reference's size and of `sample`; deterministic for a given seed, so a merged report
    computes what one client computed. Over thousands of bins, fewer draws (MIN_DRAWS at least) bound the time.
    `sample` must be positive. Cached: shards, merges and repeated samples ask the same question."""
    if sample < 1:
        raise ValueError(f"sample: expected at least one value, got {sample}")
    counts = tuple(int(c) for c in np.asarray(reference_counts, np.int64))
    return _simulated_noise(counts, sample, alpha, draws, seed)


@functools.lru_cache(maxsize=4096)
def _simulated_noise(counts: tuple[int, ...], sample: int, alpha: float, draws: int, seed: int) -> SamplingNoise:
    population = shares(counts)
    size = sum(counts)
    rng = np.random.default_rng(seed)
    draws = max(min(draws, MIN_DRAWS), min(draws, _CELLS // max(1, population.size)))
    reference = rng.multinomial(size, population, size=draws)
    traffic = rng.multinomial(sample, population, size=draws)
    psi_draws, js_draws = _psi_rows(reference, traffic), _js_rows(reference, traffic)
    return SamplingNoise(
        psi=float(np.quantile(psi_draws, 1 - alpha)),
        js_distance=float(np.quantile(js_draws, 1 - alpha)),
        mean_psi=float(psi_draws.mean()),
        alpha=alpha,
        sample=sample,
        reference=size,
    )


def unseen_noise(
    reference_singletons: int, reference: int, sample: int, alpha: float = NOISE_ALPHA, draws: int = NOISE_DRAWS
) -> float:
    """The share of a sample of `sample` values that falls, by chance alone, in categories a reference of
    `reference` values never saw, exceeded with probability alpha at most. The unseen categories' mass is the
    Good-Turing estimate (the share of reference values seen exactly once); the count is binomial, its quantile
    taken over seeded draws."""
    if sample < 1 or reference < 1:
        raise ValueError(f"sample {sample}, reference {reference}: expected positive sizes")
    mass = min(1.0, reference_singletons / reference)
    counts = np.random.default_rng(0).binomial(sample, mass, size=draws)
    return float(np.quantile(counts, 1 - alpha, method="higher") / sample)
