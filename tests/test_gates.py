"""The paired statistics against independent computations (scipy, numpy, exhaustive enumeration), and the
change-threshold gates' TFMA meaning."""

from __future__ import annotations

import argparse
import dataclasses
import itertools

import numpy as np
import pytest
from scipy import stats

from trainserve.evaluation.comparison import summarize
from trainserve.evaluation.gates import ChangeGate, change_gates, not_worse_gate, parse_change_gates
from trainserve.evaluation.noninferiority import margin_gate
from trainserve.margins import Margin, parse_margins
from trainserve.stats.means import (
    RESAMPLES,
    bootstrap_interval,
    mean_difference_interval,
    root_mean,
)
from trainserve.stats.significance import mcnemar_exact, sign_flip_test

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("b", "c"), [(0, 0), (0, 1), (1, 0), (5, 5), (3, 17), (40, 22), (0, 30), (700, 760), (2600, 2800), (4000, 3200)]
)
def test_mcnemar_exact_is_scipys_two_sided_binomial_test(b, c):
    expected = 1.0 if b + c == 0 else stats.binomtest(b, b + c, 0.5, alternative="two-sided").pvalue
    assert mcnemar_exact(b, c) == pytest.approx(expected, rel=1e-9, abs=1e-300)


def test_mcnemar_is_symmetric_and_bounded():
    assert mcnemar_exact(3, 17) == mcnemar_exact(17, 3) < 0.01
    assert all(0 < mcnemar_exact(b, 10 - b) <= 1 for b in range(11))


def test_bootstrap_interval_is_numpys_percentile_interval_of_paired_resamples():
    rng = np.random.default_rng(3)
    a, b = rng.random(500) < 0.9, rng.random(500) < 0.8  # per-example correctness of two versions
    low, high = bootstrap_interval(a, b, seed=11)
    # The same resamples drawn independently with numpy (same generator, same order), one row at a time.
    again = np.random.default_rng(11)
    differences = []
    while len(differences) < RESAMPLES:
        rows = again.integers(0, len(a), (min(250, RESAMPLES - len(differences)), len(a)))
        differences += [a[r].mean() - b[r].mean() for r in rows]
    assert (low, high) == pytest.approx(tuple(np.percentile(differences, [2.5, 97.5])), abs=1e-12)
    # And it is a 95 % interval of the difference in means: about +-1.96 standard errors around it.
    d = a.astype(float) - b
    se = d.std(ddof=1) / np.sqrt(len(d))
    assert low < d.mean() < high
    assert high - low == pytest.approx(2 * 1.96 * se, rel=0.15)


def test_bootstrap_of_rmse_uses_the_root_of_each_resample():
    rng = np.random.default_rng(0)
    a, b = rng.random(300) * 4, rng.random(300)  # squared errors
    low, high = bootstrap_interval(a, b, root_mean, seed=0)
    assert low < np.sqrt(a.mean()) - np.sqrt(b.mean()) < high and low > 0


def test_sign_flip_test_matches_exhaustive_enumeration():
    d = np.array([0.9, 1.3, -0.2, 0.7, 1.1, 0.4, -0.5, 0.8, 1.6, 0.3, -0.1, 0.6])
    flips = np.array(list(itertools.product((-1, 1), repeat=len(d))))
    exact = np.mean(np.abs(flips @ d) >= abs(d.sum()) - 1e-12)
    assert sign_flip_test(d, flips=20000, seed=1) == pytest.approx(exact, abs=0.01)
    assert sign_flip_test(np.zeros(10)) == 1.0


def test_sign_flip_test_agrees_with_a_paired_t_test_on_large_samples():
    rng = np.random.default_rng(2)
    d = rng.normal(0.08, 1.0, 2000)
    assert sign_flip_test(d, seed=0) == pytest.approx(stats.ttest_rel(d, np.zeros_like(d)).pvalue, abs=0.01)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("accuracy>=-0.005", ChangeGate("accuracy", ">=", -0.005)),
        ("accuracy >= -1%", ChangeGate("accuracy", ">=", -1.0, True)),
        ("loss<=0.01", ChangeGate("loss", "<=", 0.01)),
        ("mse<=2%", ChangeGate("mse", "<=", 2.0, True)),
    ],
)
def test_change_thresholds_parse(text, want):
    assert parse_change_gates(text) == (want,)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("accuracy<=0.01", "higher accuracy is better, so its change threshold is accuracy>=CHANGE"),
        ("loss>=-0.1", "lower loss is better"),
        ("f1>=0", "no direction known for 'f1'"),
        ("accuracy=>0", "expected METRIC>=CHANGE or METRIC<=CHANGE"),
    ],
)
def test_change_thresholds_against_the_metrics_direction_are_refused(text, fragment):
    with pytest.raises(argparse.ArgumentTypeError, match=fragment):
        parse_change_gates(text)


def test_change_gates_judge_the_change_in_the_better_direction():
    comparison = {
        "baseline": {"version": 6},
        "metrics": {"accuracy": {"candidate": 0.91, "baseline": 0.92}, "loss": {"candidate": 0.30, "baseline": 0.25}},
    }
    gates = parse_change_gates("accuracy>=-0.005,accuracy>=-2%,loss<=0.1,loss<=10%")
    judged = change_gates(gates, comparison)
    assert [g["passed"] for g in judged] == [False, True, True, False]
    assert judged[0]["value"] == pytest.approx(-0.01) and judged[1]["value"] == pytest.approx(-1 / 0.92)
    assert judged[3]["value"] == pytest.approx(20.0) and judged[0]["baseline_version"] == 6
    assert judged[0]["said"] == "accuracy changed by -0.01 vs version 6, expected >= -0.005"


def _tally(kind: str):
    from trainserve.evaluation.metrics import task_metrics
    from trainserve.evaluation.plan import Plan
    from trainserve.evaluation.records import Tally
    from trainserve.task import Task

    task = (
        Task("classification", classes=2, label_names=("a", "b"))
        if kind == "classification"
        else Task("regression", targets=1)
    )
    plan = Plan((), task, "p")
    return Tally(plan, task_metrics(task, 1))


def test_verdict_and_not_worse_gate_follow_the_test_not_the_point_estimate():
    truth = np.zeros(400, np.int64)
    right = lambda p: {"accuracy": p, "top_k_accuracy": p, "loss": 1 - p, "truth": truth}  # noqa: E731
    worse = np.r_[np.ones(300), np.zeros(100)], np.r_[np.ones(360), np.zeros(40)]  # 60 discordant, all one way
    slightly = np.r_[np.ones(300), np.zeros(100)], np.r_[np.ones(302), np.zeros(98)]  # 2 discordant
    tallies = (_tally("classification"), _tally("classification"))
    for (mine, theirs), verdict in ((worse, "worse"), (slightly, "no significant difference")):
        c = summarize("1", (2, 1), tallies, (right(mine), right(theirs)), 0.05, 0)
        assert c["verdict"] == verdict and c["verdict_line"].startswith(f"v2 vs v1: {verdict} (p=")
        assert not_worse_gate(c, 0.05)["passed"] is (verdict != "worse")
    assert c["test"]["discordant"] == {"both_right": 300, "candidate_only": 0, "baseline_only": 2, "both_wrong": 98}


def test_sign_flip_counts_the_observed_arrangement_and_ties_as_extreme():
    # Twenty equal differences: no flip is more extreme, so p is the observed arrangement's own 1 / (1 + flips).
    assert sign_flip_test(np.ones(20), flips=99, seed=0) == pytest.approx(0.01)
    # Four equal differences: |sum| ties the observed one exactly when all signs agree, 2 of 16 arrangements.
    assert sign_flip_test(np.ones(4), flips=20000, seed=0) == pytest.approx(0.125, abs=0.01)


def _classification_values(mine: np.ndarray, theirs: np.ndarray) -> tuple[dict, dict]:
    truth = np.zeros(len(mine), np.int64)
    right = lambda p: {"accuracy": p, "top_k_accuracy": p, "loss": 1.0 - p, "truth": truth}  # noqa: E731
    return right(mine.astype(float)), right(theirs.astype(float))


def _pairs(n: int, candidate_only: int, baseline_only: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-example correctness of two versions: both right except the discordant pairs."""
    mine, theirs = np.ones(n, bool), np.ones(n, bool)
    theirs[:candidate_only] = False
    mine[candidate_only : candidate_only + baseline_only] = False
    return mine, theirs


def test_worse_at_the_level_asked_not_half_of_it():
    """6 discordant pairs all against the candidate: p = 0.03125, between alpha / 2 and alpha = 0.05."""
    tallies = (_tally("classification"), _tally("classification"))
    c = summarize("1", (2, 1), tallies, _classification_values(*_pairs(300, 0, 6)), 0.05, 0)
    assert c["test"]["p_value"] == pytest.approx(stats.binomtest(0, 6).pvalue) == 0.03125
    assert c["verdict"] == "worse" and c["metrics"]["accuracy"]["interval"][1] < 0
    c = summarize("1", (2, 1), tallies, _classification_values(*_pairs(300, 0, 6)), 0.02, 0)
    assert c["verdict"] == "no significant difference" and c["metrics"]["accuracy"]["interval"][1] > 0


def test_three_points_worse_on_300_examples_does_not_pass_the_default_margin():
    tallies = (_tally("classification"), _tally("classification"))
    c = summarize("1", (2, 1), tallies, _classification_values(*_pairs(300, 6, 15)), 0.05, 0)
    gate = margin_gate(parse_margins("accuracy=0.01")[0], c)
    assert c["metrics"]["accuracy"]["difference"] == pytest.approx(-0.03)
    assert gate["verdict"] in ("inconclusive", "inferior") and gate["passed"] is False
    assert gate["mdd"] == c["metrics"]["accuracy"]["mdd"] > 0.03 and gate["examples_needed"] > 300
    assert "examples would decide" in gate["said"]
    # The significance gate alone lets it through: absence of evidence (p = 0.078).
    assert not_worse_gate(c, 0.05)["passed"] is True
    # 5 examples, 1.0 vs 0.0: nothing passes as proven.
    c = summarize("1", (2, 1), tallies, _classification_values(*_pairs(5, 0, 5)), 0.05, 0)
    assert margin_gate(parse_margins("accuracy=0.01")[0], c)["verdict"] == "inconclusive"


def _regression_values(mine: np.ndarray, theirs: np.ndarray) -> tuple[dict, dict]:
    return ({"mse": v, "rmse": v, "mae": np.sqrt(v)} for v in (mine, theirs))


def test_lower_is_better_metrics_judge_the_change_downwards():
    """MSE: a candidate with smaller squared errors is better and non-inferior; one with larger is worse."""
    rng = np.random.default_rng(0)
    base = rng.exponential(1.0, 400)
    tallies = (_tally("regression"), _tally("regression"))
    smaller = summarize("1", (2, 1), tallies, tuple(_regression_values(base * 0.7, base)), 0.05, 0)
    larger = summarize("1", (2, 1), tallies, tuple(_regression_values(base * 1.5, base)), 0.05, 0)
    assert smaller["verdict"] == "better" and larger["verdict"] == "worse"
    assert smaller["primary_metric"] == "mse" and smaller["test"]["p_value"] < 0.01
    ni = [margin_gate(Margin("mse", 5.0, relative=True), c) for c in (smaller, larger)]
    assert [g["verdict"] for g in ni] == ["non-inferior", "inferior"] and [g["passed"] for g in ni] == [True, False]
    assert ni[0]["margin"] == pytest.approx(0.05 * base.mean())
    # The bound is the mean interval's end in the better direction: the negated upper end of the MSE change.
    assert ni[0]["value"] == pytest.approx(-mean_difference_interval(base * 0.7 - base, 0.95, seed=0)[1], rel=1e-12)


def test_promote_re_derives_a_margin_gate_from_the_recorded_interval():
    """trainserve.evidence.decision judges the non-inferiority gate again from the comparison's numbers: a report
    edited to pass (the gate's verdict, its bound, or the interval under it) is refused."""
    import copy

    from trainserve.evidence import decision

    tallies = (_tally("classification"), _tally("classification"))
    c = summarize("1", (2, 1), tallies, _classification_values(*_pairs(3000, 30, 31)), 0.05, 0)
    report = {"comparison": c, "gates": [margin_gate(parse_margins("accuracy=1%")[0], c)]}
    assert report["gates"][0]["verdict"] == "non-inferior" and decision.decide(report).passed
    assert decision.derive_gate(report["gates"][0], report) is True
    inconclusive = copy.deepcopy(report)
    inconclusive["comparison"]["metrics"]["accuracy"]["interval"][0] = -0.5  # the numbers no longer prove it
    flipped = copy.deepcopy(report)
    flipped["gates"][0].update(verdict="inconclusive", passed=False)
    wider = copy.deepcopy(report)
    wider["gates"][0]["margin"] = 0.5
    for edited in (inconclusive, flipped, wider):
        assert decision.derive_gate(edited["gates"][0], edited) is None and not decision.decide(edited).passed
    # Lower is better: the bound is the negated upper end of the MSE change, and it is re-derived so.
    rng = np.random.default_rng(1)
    base = rng.exponential(1.0, 300)
    r = summarize("1", (2, 1), (_tally("regression"),) * 2, tuple(_regression_values(base * 1.4, base)), 0.05, 0)
    gate = margin_gate(Margin("mse", 5.0, relative=True), r)
    assert gate["verdict"] == "inferior" and decision.derive_gate(gate, {"comparison": r}) is False


@pytest.mark.parametrize(("alpha", "two_sided", "one_sided"), [(0.05, "95%", "2.5%"), (0.1, "90%", "5%")])
def test_the_levels_are_said_where_the_numbers_are_read(alpha, two_sided, one_sided):
    """Eval's table and --help say the conventions: the test and intervals two-sided at alpha, a gate on an
    interval's end one-sided at alpha / 2; replay's flip-rate bound one-sided at its alpha."""
    from trainserve.evaluation.comparison import comparison_lines
    from trainserve.evaluation.config import EvalConfig
    from trainserve.replay.config import ReplayConfig

    def field_help(cls, name: str) -> str:
        return next(f.metadata["help"] for f in dataclasses.fields(cls) if f.name == name)

    tallies = (_tally("classification"), _tally("classification"))
    c = summarize("1", (2, 1), tallies, _classification_values(*_pairs(400, 5, 9)), alpha, 0)
    said = "\n".join(comparison_lines(c))
    assert f"two-sided at alpha {alpha:g} ({two_sided})" in said and f"one-sided at {one_sided}" in said
    assert "one-sided at ALPHA / 2" in field_help(EvalConfig, "alpha")
    assert "one-sided" in field_help(ReplayConfig, "alpha")
