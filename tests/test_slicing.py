"""Slices: a regression in one part that the average hides is found and named, with the family's error
controlled (Holm, or Benjamini-Hochberg when asked); a candidate equal everywhere is not flagged."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from trainserve.evaluation.comparison import summarize
from trainserve.evaluation.data import ArrayData, Column, open_eval_data
from trainserve.evaluation.metrics import task_metrics
from trainserve.evaluation.plan import Plan
from trainserve.evaluation.records import Tally
from trainserve.evaluation.slicing import parse_slice, slice_gate, slice_keys
from trainserve.evidence import decision
from trainserve.task import Task

pytestmark = pytest.mark.unit


def _tallies(task: Task):
    return tuple(Tally(Plan((), task, "p"), task_metrics(task, 1)) for _ in range(2))


def _classification(mine: np.ndarray, theirs: np.ndarray, truth: np.ndarray) -> tuple[dict, dict]:
    def right(p):
        return {"accuracy": p.astype(float), "top_k_accuracy": p.astype(float), "loss": 1.0 - p, "truth": truth}

    return right(mine), right(theirs)


def _minority_lost():
    """The issue's case: a 50-example class goes from 45 right to 0, the 950-example majority gains 50."""
    truth = np.r_[np.zeros(950, np.int64), np.ones(50, np.int64)]
    theirs = np.r_[np.r_[np.ones(850), np.zeros(100)], np.r_[np.ones(45), np.zeros(5)]].astype(bool)
    mine = np.r_[np.r_[np.ones(900), np.zeros(50)], np.zeros(50)].astype(bool)
    return mine, theirs, truth


def test_a_lost_minority_class_is_named_though_the_overall_test_is_not_significant():
    mine, theirs, truth = _minority_lost()
    task = Task("classification", classes=2, label_names=("common", "rare"))
    c = summarize("1", (2, 1), _tallies(task), _classification(mine, theirs, truth), 0.05, 0)
    assert c["verdict"] == "no significant difference" and c["test"]["p_value"] > 0.5
    table = c["slices"]
    assert table["correction"] == "holm" and table["worse"] == ["class=rare"]
    common, rare = table["rows"]  # sorted by evidence: 50 to 0 for the candidate, then 0 to 45 against it
    assert rare["name"] == "class=rare" and rare["examples"] == 50 and rare["discordant"]["baseline_only"] == 45
    p_rare, p_common = stats.binomtest(0, 45).pvalue, stats.binomtest(50, 50).pvalue
    # Holm over two slices: the smaller p times 2, the larger times 1 (never below the one before).
    assert common["direction"] == "better" and common["p_adjusted"] == pytest.approx(2 * p_common, rel=1e-6)
    assert rare["p_adjusted"] == pytest.approx(max(p_rare, 2 * p_common), rel=1e-6) and rare["direction"] == "worse"
    assert "significantly worse on class=rare (n=50, accuracy 0.0000 vs 0.9000, holm-adjusted p=" in c["verdict_line"]
    gate = slice_gate(table, 1)
    assert gate["passed"] is False and gate["slices"] == ["class=rare"]
    assert decision.derive_gate(gate, {"comparison": c}) is False
    edited = {**gate, "slices": [], "value": 0, "passed": True}
    assert decision.derive_gate(edited, {"comparison": c}) is None  # the table says otherwise: refused


def test_equal_versions_are_not_flagged_and_bh_is_said_when_asked():
    rng = np.random.default_rng(4)
    truth = rng.integers(0, 4, 2000)
    theirs = rng.random(2000) < 0.9
    mine = theirs.copy()
    for c in range(4):  # in every class 8 examples change each way: equal on every slice
        for side in (True, False):
            flip = rng.choice(np.flatnonzero((truth == c) & (theirs == side)), 8, replace=False)
            mine[flip] = ~side
    task = Task("classification", classes=4, label_names=("a", "b", "c", "d"))
    c = summarize("1", (2, 1), _tallies(task), _classification(mine, theirs, truth), 0.05, 0, correction="bh")
    assert c["slices"]["worse"] == [] and c["slices"]["correction"] == "bh"
    assert "Benjamini-Hochberg" in c["slices"]["correction_name"] and len(c["slices"]["rows"]) == 4
    assert slice_gate(c["slices"], 1)["passed"] is True


def test_a_target_that_collapses_is_found_per_target():
    """Two targets on scales 100 and 0.1: target 1's errors grow from 0.01 to 0.5 while target 0's noise hides it
    in the average of squared errors."""
    rng = np.random.default_rng(2)
    n = 300
    base = np.c_[rng.normal(0, 10, n), rng.normal(0, 0.01, n)]
    worse = np.c_[rng.normal(0, 10, n), rng.normal(0, 0.5, n)]

    def values(errors):
        squared = np.mean(errors**2, axis=1)
        return {
            "mse": squared,
            "rmse": squared,
            "mae": np.mean(np.abs(errors), axis=1),
            "squared_per_target": errors**2,
        }

    task = Task("regression", targets=2)
    c = summarize("1", (2, 1), _tallies(task), (values(worse), values(base)), 0.05, 0)
    assert c["test"]["p_value"] > 0.05 and c["slices"]["worse"] == ["target=1"]
    assert {r["name"] for r in c["slices"]["rows"]} == {"target=0", "target=1"}


def test_slices_of_a_csv_column_crossed_and_of_an_npz_key(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("region,device,x,y\nnorth,ios,1,a\nsouth,ios,2,b\nnorth,web,3,a\n")
    data = open_eval_data(str(csv), label_column="y")
    assert slice_keys(data, parse_slice("region")).tolist() == ["region=north", "region=south", "region=north"]
    crossed = slice_keys(data, parse_slice("region,device")).tolist()
    assert crossed == ["region=north,device=ios", "region=south,device=ios", "region=north,device=web"]
    np.savez(
        tmp_path / "d.npz", x_test=np.zeros((3, 2), np.float32), y_test=np.arange(3), region=np.array(["a", "b", "a"])
    )
    npz = open_eval_data(str(tmp_path / "d.npz"))
    assert slice_keys(npz, ("region",)).tolist() == ["region=a", "region=b", "region=a"]
    from trainserve.errors import TrainserveError

    with pytest.raises(TrainserveError, match="has no column 'nope'"):
        slice_keys(data, ("nope",))


def test_the_class_of_an_image_folder_or_any_labelled_data():
    data = ArrayData("d", {"x": Column("x", (), np.dtype(float))}, np.array([0, 1, 1]), 3, ["cat", "dog"])
    assert slice_keys(data, ("class",)).tolist() == ["class=cat", "class=dog", "class=dog"]
