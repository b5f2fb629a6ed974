"""Drift's statistics (trainserve.stats.divergence) against independent computations, and the false-alarm rate
of its verdict on undrifted traffic counted by a seeded simulation.

PSI and the Jensen-Shannon distance equal their formula and scipy's `jensenshannon`. On samples they are biased
upward: n * PSI of a sample against the shares it was drawn from is about Pearson's chi-squared statistic, so PSI
is about chi2(k - 1) * (1/n + 1/m) when the reference is a sample of m too; the simulated allowance agrees with
scipy's chi-squared where that approximation holds (large n, no sparse bins) and exceeds it on small samples,
where one empty bin adds 0.69 (why drift simulates instead of using the chi-squared quantile)."""

from __future__ import annotations

import numpy as np
import pytest
from drift_tables import judged, table, training_profile
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as scipy_stats
from scipy.spatial.distance import jensenshannon

from trainserve.stats.divergence import EPSILON, js_distance, psi, sampling_noise, unseen_noise

pytestmark = pytest.mark.unit

FALSE_ALARM_RATE = 0.01  # what docs/replay-and-drift.md states: at most 1 % of undrifted features flagged


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 500), min_size=2, max_size=12).filter(lambda c: sum(c) > 0),
    st.data(),
)
def test_psi_and_js_distance_equal_their_formula_and_scipy(expected, data):
    actual = data.draw(st.lists(st.integers(0, 500), min_size=len(expected), max_size=len(expected)))
    if not sum(actual):
        actual[0] = 1
    e, a = np.array(expected) / sum(expected), np.array(actual) / sum(actual)
    fe, fa = np.maximum(e, EPSILON), np.maximum(a, EPSILON)
    assert psi(expected, actual) == pytest.approx(np.sum((fa - fe) * np.log(fa / fe)), rel=1e-12, abs=1e-15)
    assert js_distance(expected, actual) == pytest.approx(jensenshannon(e, a, base=2), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("bins", [4, 10])
def test_the_psi_of_undrifted_samples_is_chi_squared_over_the_sample_sizes(bins):
    """The derivation: E[PSI] = (k - 1)(1/n + 1/m) and its 99th percentile chi2.ppf(0.99, k - 1)(1/n + 1/m)."""
    reference = np.full(bins, 20_000 // bins)
    m, n = int(reference.sum()), 5000
    noise = sampling_noise(reference, n)
    scale = 1 / n + 1 / m
    assert noise.mean_psi == pytest.approx((bins - 1) * scale, rel=0.08)
    assert noise.psi == pytest.approx(scipy_stats.chi2.ppf(0.99, bins - 1) * scale, rel=0.12)
    small = sampling_noise(np.full(10, 6000), 50)  # empty bins at n = 50: a heavier tail than chi-squared's
    assert small.psi > 1.5 * scipy_stats.chi2.ppf(0.99, 9) * (1 / 50 + 1 / 60_000)
    assert sampling_noise(np.full(10, 6000), 50) == small  # seeded: a merge computes the same allowance


def test_the_unseen_share_allowance_is_the_binomial_quantile_of_the_good_turing_mass():
    """120 of 6,000 training values were seen once: about 2 % of the population lies in categories not seen."""
    for n in (50, 200, 1000):
        expected = scipy_stats.binom.ppf(0.99, n, 120 / 6000) / n
        assert unseen_noise(120, 6000, n) == pytest.approx(expected, abs=1.01 / n)
    assert unseen_noise(0, 6000, 50) == 0.0


@pytest.fixture(scope="module")
def profile():
    return training_profile()


@pytest.mark.parametrize("rows", [50, 200, 1000])
def test_undrifted_traffic_flags_at_most_the_stated_share_of_features(profile, rows):
    """Samples of `rows` requests of the training distribution, 31 features each: the share flagged is at most
    the documented rate, where the rule without the noise allowance (PSI > 0.25, unseen > 1 %) flags far more
    at 50 requests (a dozen of 31 in the issue)."""
    flagged = naive = judged_count = 0
    for rep in range(25):
        rows_judged = judged(profile, table(rows, 1000 * rows + rep))
        judged_count += len(rows_judged)
        flagged += sum(r["drifted"] for r in rows_judged)
        naive += sum(r["psi"] > 0.25 or (r["unseen_share"] or 0) > 0.01 for r in rows_judged)
    assert judged_count == 25 * 31
    assert flagged / judged_count <= FALSE_ALARM_RATE, (flagged, judged_count)
    if rows == 50:
        assert naive / judged_count > 0.2  # the simulation does produce the noise the allowance must absorb


@pytest.mark.parametrize("rows", [200, 1000])
def test_a_one_sd_shift_is_still_flagged(profile, rows):
    """The allowance is not so wide that it hides what matters: age moved by one training sd is flagged."""
    for rep in range(5):
        rows_judged = {r["feature"]: r for r in judged(profile, table(rows, 7 + rep, age_shift=10.0))}
        assert rows_judged["age"]["verdict"] == "drifted", rows_judged["age"]
        assert not any(r["drifted"] for name, r in rows_judged.items() if name != "age")


def test_too_few_values_to_tell_is_said_not_stable(profile):
    rows = {r["feature"]: r for r in judged(profile, table(20, 3))}
    assert rows["age"]["verdict"] == "too few" and rows["age"]["noise"]["psi"] > 0.25
    assert rows["size"]["verdict"] in ("stable", "too few")
    big = {r["feature"]: r for r in judged(profile, table(2000, 3))}
    assert big["age"]["verdict"] == "stable" and big["age"]["psi_threshold"] < 0.3
