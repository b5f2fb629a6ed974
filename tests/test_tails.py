"""The regression gates' tail check (trainserve.stats.tails) and what it does to live-eval's and eval's gates: its
degrees of freedom are Student's and Welch's for normal kurtosis and fall with heavier tails (checked against
scipy's kurtosis); at the margin, with each example's error scaled by a log-normal factor, the live gate that
passed about 18 % (paired) and 15-27 % (unpaired) now passes at most the nominal 2.5 % plus three binomial standard
errors; the gates say why they held a pass back, and promote re-derives eval's verdict with the check.
bench/live_eval_gates_tails.py prints the full table."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as scipy_stats

from trainserve.evaluation.noninferiority import Margin, margin_gate
from trainserve.evidence import decision
from trainserve.live.config import drop_margin
from trainserve.live.gates import error_drop_gate
from trainserve.stats.skewed_means import skewed_difference_interval, skewed_mean_interval
from trainserve.stats.tails import MIN_DF, Side, effective_df, side_from_sums, side_from_values, tail_check

pytestmark = pytest.mark.unit
NOMINAL = 0.025


def sums(values: np.ndarray) -> dict:
    """What a report keeps of `values`: n and the sums of the first four powers."""
    names = ("sum", "sum_sq", "sum_cu", "sum_qu")
    return {"n": len(values), **{k: float(np.sum(values ** (p + 1))) for p, k in enumerate(names)}}


def side(s: dict) -> Side | None:
    return side_from_sums(s["n"], s["sum"], s["sum_sq"], s["sum_cu"], s.get("sum_qu"))


def tolerance(draws: int) -> float:
    return NOMINAL + 3 * math.sqrt(NOMINAL * (1 - NOMINAL) / draws)


@given(st.integers(3, 400), st.integers(3, 400), st.floats(0.1, 10), st.floats(0.1, 10))
@settings(max_examples=60, deadline=None)
def test_normal_kurtosis_gives_students_and_welchs_degrees_of_freedom(n_a, n_b, var_a, var_b):
    share_a, share_b = var_a / n_a, var_b / n_b
    welch = (share_a + share_b) ** 2 / (share_a**2 / (n_a - 1) + share_b**2 / (n_b - 1))
    assert effective_df([Side(n_a, var_a, 3.0)]) == pytest.approx(n_a - 1, rel=1e-9)
    assert effective_df([Side(n_a, var_a, 3.0), Side(n_b, var_b, 3.0)]) == pytest.approx(welch, rel=1e-9)
    assert effective_df([Side(n_a, var_a, 9.0), Side(n_b, var_b, 3.0)]) < welch  # heavier tails: fewer


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_kurtosis_from_sums_is_scipys_and_never_below_normal(seed):
    rng = np.random.default_rng(seed)
    heavy, light = rng.standard_t(4, 300), rng.uniform(size=300)
    assert side(sums(heavy)).kurtosis == pytest.approx(scipy_stats.kurtosis(heavy, fisher=False), rel=1e-6)
    assert side(sums(heavy)).variance == pytest.approx(np.var(heavy, ddof=1), rel=1e-9)
    assert side(sums(light)).kurtosis == 3.0  # a uniform's 1.8 would claim more certainty than normal values give
    assert side_from_values(heavy) == side(sums(heavy))


def test_a_heteroscedastic_paired_squared_error_gate_at_the_margin_holds_its_rate():
    """Each example's errors scaled by a log-normal factor (sigma 1), 200 examples both answered, the candidate 1.3
    times as spread (correlation 0.9): the skew-corrected interval alone passes about 18 % at the margin."""
    draws, n, rho = 400, 200, 0.9
    rng = np.random.default_rng(11)
    scale = rng.lognormal(0, 1, (draws, n))
    base, other = rng.standard_normal((draws, n)), rng.standard_normal((draws, n))
    cand = 1.3 * (rho * base + math.sqrt(1 - rho * rho) * other)
    margin = math.exp(2) * (1.3**2 - 1)  # E[scale^2] times the rise of the unit-scale errors' mean square
    before = after = 0
    for d in (scale * cand) ** 2 - (scale * base) ** 2:
        s = sums(d)
        inside = skewed_mean_interval(n, s["sum"], s["sum_sq"], s["sum_cu"], 0.95)[1] < margin
        before += inside
        after += inside and tail_check([side(s)])["enough"]
    assert before / draws > 0.08, "the scenario that made the old gate pass too often"
    assert after / draws <= tolerance(draws), after / draws


def test_a_heteroscedastic_unpaired_canary_of_50_labels_holds_its_rate():
    """50 canary labels against the baseline's 1,000, squared errors with a log-normal scale (sigma 0.5), the
    candidate 1.5 times as spread: the skew-corrected Welch interval alone passes about 9 %."""
    draws = 300
    rng = np.random.default_rng(12)
    cand = (1.5 * rng.lognormal(0, 0.5, (draws, 50)) * rng.standard_normal((draws, 50))) ** 2
    base = (rng.lognormal(0, 0.5, (draws, 1000)) * rng.standard_normal((draws, 1000))) ** 2
    margin = math.exp(2 * 0.25) * (1.5**2 - 1)
    before = after = 0
    for c, b in zip(cand, base):
        inside = skewed_difference_interval(sums(c), sums(b), 0.95)[1] < margin
        before += inside
        after += inside and tail_check([side(sums(c)), side(sums(b))])["enough"]
    assert before / draws > 0.05 and after / draws <= tolerance(draws), (before / draws, after / draws)


def _pair(d: np.ndarray) -> dict:
    s = sums(d)
    return {"versions": [1, 2], "examples": len(d), "differences": {"squared_error": s, "absolute_error": s}}


def _version(version: int, mse: float) -> dict:
    return {"version": version, "overall": {"examples": 300, "mse": mse, "mae": mse}}


def test_live_evals_gate_says_why_it_holds_back_a_pass_the_tail_cannot_support():
    """A bound inside the margin on errors whose tail is too heavy is inconclusive with the reason and the
    examples that would do; --inconclusive pass still passes it, as it passes too few labels; light tails pass."""
    rng = np.random.default_rng(3)
    heavy = rng.lognormal(0, 2, 300) * rng.standard_normal(300) * 0.01
    light = rng.normal(0, 0.01, 300)
    margin = drop_margin("mse=1")
    gates = {
        name: error_drop_gate(_version(1, 1.0), _version(2, 1.0), _pair(d), margin, 0.95, "fail")
        for name, d in (("heavy", heavy), ("light", light))
    }
    assert gates["light"]["verdict"] == "non-inferior" and gates["light"]["tail"]["enough"]
    held = gates["heavy"]
    assert held["interval"][1] < 1 and held["verdict"] == "inconclusive" and not held["passed"]
    assert held["tail"]["df"] < MIN_DF and f"fewer than {MIN_DF}" in held["said"]
    assert "the errors' tail is too heavy for 300 examples to bound the mean" in held["said"]
    assert "would do at the tail seen" in held["said"]
    lenient = error_drop_gate(_version(1, 1.0), _version(2, 1.0), _pair(heavy), margin, 0.95, "pass")
    assert lenient["passed"]


def test_a_merged_report_without_fourth_power_sums_cannot_pass_on_the_bound():
    pair = _pair(np.random.default_rng(4).normal(0, 0.01, 300))
    for kind in pair["differences"]:
        pair["differences"][kind] = {k: v for k, v in pair["differences"][kind].items() if k != "sum_qu"}
    gate = error_drop_gate(_version(1, 1.0), _version(2, 1.0), pair, drop_margin("mse=1"), 0.95, "fail")
    assert gate["verdict"] == "inconclusive" and "no fourth-power sums" in gate["said"]


def test_evals_margin_gate_is_inconclusive_on_a_heavy_tail_and_promote_re_derives_it_so():
    rng = np.random.default_rng(5)
    d = rng.lognormal(0, 2, 300) * rng.standard_normal(300) * 0.01
    metric = {
        "candidate": 1.0 + d.mean(),
        "baseline": 1.0,
        "difference": float(d.mean()),
        "interval": [float(d.mean()) - 0.01, float(d.mean()) + 0.01],
        "higher_is_better": False,
        "sd": float(d.std(ddof=1)),
        "tail": tail_check([side_from_values(d)]),
    }
    comparison = {"metrics": {"mse": metric}, "baseline": {"version": 1}, "level": 0.95}
    gate = margin_gate(Margin("mse", 0.5), comparison)
    assert gate["verdict"] == "inconclusive" and not gate["passed"] and "too heavy" in gate["said"]
    report = {"comparison": comparison, "gates": [gate]}
    assert decision.derive_gate(gate, report) is False, "promote re-derives the same verdict: not a forged one"
    forged = gate | {"verdict": "non-inferior", "passed": True}
    assert decision.derive_gate(forged, {"comparison": comparison, "gates": [forged]}) is None
