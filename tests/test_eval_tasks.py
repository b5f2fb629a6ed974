"""`trainserve eval` on any served model: metrics checked against scikit-learn, a SavedModel not made by
trainserve (two inputs, dict outputs) evaluated with --task and --output over real gRPC, and bad input
refused in one line before the first Predict."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from sklearn import metrics as sk

from conftest import install_version, predict_count, save_foreign_model, serve_counted
from trainserve.cli import main
from trainserve.errors import TrainserveError
from trainserve.evaluation.metrics import (
    ClassificationMetrics,
    RegressionMetrics,
    average_precision,
    output_kind,
    roc_auc,
)
from trainserve.evidence.document import validate_report
from trainserve.task import Task


def _in_batches(tally, labels, scores, sizes=(7, 1, 50, 300)):
    """Feed a tally uneven batches, as concurrent answers arrive."""
    start = 0
    for size in (s for s in sizes * 100):
        if start >= len(labels):
            break
        tally.add(labels[start : start + size], scores[start : start + size], "out")
        start += size
    return tally.summary()


@pytest.mark.unit
def test_binary_curves_equal_scikit_learn_with_ties():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 500)
    scores = np.round(rng.random(500) * 0.5 + labels * 0.3, 2).astype(np.float32)  # rounded: many ties
    assert roc_auc(labels, scores) == pytest.approx(sk.roc_auc_score(labels, scores), abs=1e-12)
    assert average_precision(labels, scores) == pytest.approx(sk.average_precision_score(labels, scores), abs=1e-12)
    assert roc_auc(np.ones(3, int), np.ones(3)) is None, "undefined with one class"


@pytest.mark.unit
@pytest.mark.parametrize("columns", [1, 2], ids=["one-sigmoid-score", "two-softmax-columns"])
@pytest.mark.parametrize("kind", ["probabilities", "logits"])
def test_classification_loss_and_auc_equal_scikit_learn(columns, kind):
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 2, 400)
    logits = rng.normal(size=(400, columns)) + labels[:, None] * (1 if columns == 1 else np.array([-1, 1]))
    if columns == 1:
        p1 = 1 / (1 + np.exp(-logits[:, 0]))
        probabilities = np.stack([1 - p1, p1], axis=1)
    else:
        probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    served = (logits if kind == "logits" else (probabilities[:, 1:] if columns == 1 else probabilities)).astype(
        np.float32
    )
    summary = _in_batches(
        ClassificationMetrics(Task("classification", classes=2, label_names=("a", "b")), 5), labels, served
    )
    assert summary["output_kind"] == kind
    assert summary["loss"] == pytest.approx(sk.log_loss(labels, probabilities), rel=1e-4)
    assert summary["accuracy"] == pytest.approx(sk.accuracy_score(labels, probabilities.argmax(1)))
    assert summary["roc_auc"] == pytest.approx(sk.roc_auc_score(labels, probabilities[:, 1]), abs=1e-6)
    assert summary["average_precision"] == pytest.approx(
        sk.average_precision_score(labels, probabilities[:, 1]), abs=1e-6
    )


@pytest.mark.unit
def test_independent_sigmoids_are_refused_not_scored():
    with pytest.raises(TrainserveError, match="do not sum to 1.*multi-label"):
        output_kind(np.full((4, 3), 0.9, np.float32), "out")


@pytest.mark.unit
def test_regression_metrics_equal_scikit_learn_per_target():
    rng = np.random.default_rng(2)
    truth = (rng.normal(size=(999, 3)) * [1, 10, 0.1] + [0, 1e4, -5]).astype(np.float32)  # offsets test stability
    predicted = (truth + rng.normal(size=truth.shape) * [0.5, 3, 0.05]).astype(np.float32)
    summary = _in_batches(RegressionMetrics(Task("regression", targets=3)), truth, predicted)
    assert summary["mse"] == pytest.approx(sk.mean_squared_error(truth, predicted), rel=1e-5)
    assert summary["mae"] == pytest.approx(sk.mean_absolute_error(truth, predicted), rel=1e-5)
    assert summary["r2"] == pytest.approx(sk.r2_score(truth, predicted), rel=1e-5)
    for t, row in enumerate(summary["per_target"]):
        assert row["r2"] == pytest.approx(sk.r2_score(truth[:, t], predicted[:, t]), rel=1e-5)
        assert row["rmse"] == pytest.approx(np.sqrt(sk.mean_squared_error(truth[:, t], predicted[:, t])), rel=1e-5)


# --- a SavedModel not made by trainserve, over real gRPC -------------------------------------------------

N = 300


@pytest.fixture(scope="module")
def foreign(tmp_path_factory):
    """serve-local (in this process) serving `f`: inputs x float32 [N, 3] and offset int64 [N]; outputs scaled
    (2x) float32 [N, 3], shifted int64 [N], total (sum of x) float32 [N]. Data with both inputs and noisy labels."""
    root = tmp_path_factory.mktemp("foreign")
    install_version(save_foreign_model(root / "saved"), root / "f", 1)
    server = serve_counted(root, "f")
    rng = np.random.default_rng(3)
    x = rng.normal(size=(N, 3)).astype(np.float32)
    offset = rng.integers(0, 9, N)
    data = {"x": x, "offset": offset, "root": root}
    data["total_y"] = (x.sum(axis=1) + rng.normal(size=N) * 0.3).astype(np.float32)
    data["class_y"] = np.where(rng.random(N) < 0.8, x.argmax(axis=1), rng.integers(0, 3, N))  # 80 % learnable
    yield server, data
    assert server.stop() == 0


def _npz(root, name, **arrays):
    np.savez(root / f"{name}.npz", **arrays)
    return str(root / f"{name}.npz")


def _eval(server, data_path, *args, report=None):
    return main(
        [
            "eval",
            "--server",
            server.target,
            "--model",
            "f",
            "--data",
            data_path,
            "--batch-size",
            "64",
            *(["--report", str(report)] if report else []),
            *args,
        ]
    )


@pytest.mark.unit
def test_foreign_regression_output_chosen_by_name(foreign, tmp_path, capsys):
    server, d = foreign
    path = _npz(tmp_path, "reg", **{"x_test/x": d["x"], "x_test/offset": d["offset"], "y_test": d["total_y"]})
    code = _eval(
        server,
        path,
        "--output",
        "total",
        "--require",
        "r2>=0.5,rmse<=0.5",
        "--plots",
        str(tmp_path / "p"),
        report=tmp_path / "r.json",
    )
    assert code == 0, capsys.readouterr().err
    report = json.loads((tmp_path / "r.json").read_text())
    validate_report(report)
    total = d["x"].sum(axis=1)  # what the model computes, independently
    assert report["task"]["kind"] == "regression" and report["output"] == "total"
    assert report["metrics"]["mse"] == pytest.approx(sk.mean_squared_error(d["total_y"], total), rel=1e-4)
    assert report["metrics"]["r2"] == pytest.approx(sk.r2_score(d["total_y"], total), rel=1e-4)
    assert [g["passed"] for g in report["gates"]] == [True, True] and report["passed"]
    assert report["data"]["inputs"]["offset"] == {"key": "offset", "dtype": "int64", "shape": []}
    for name in ("predicted_vs_true.png", "residuals.png", "latency_histogram.png"):
        assert (tmp_path / "p" / name).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.unit
def test_foreign_logits_as_classification_with_an_input_map(foreign, tmp_path, capsys):
    server, d = foreign
    path = _npz(tmp_path, "cls", **{"x_test/features": d["x"], "x_test/offset": d["offset"], "y_test": d["class_y"]})
    code = _eval(
        server,
        path,
        "--task",
        "classification",
        "--output",
        "scaled",
        "--input-map",
        "features=x",
        report=tmp_path / "r.json",
    )
    assert code == 0, capsys.readouterr().err
    report = json.loads((tmp_path / "r.json").read_text())
    validate_report(report)
    logits = 2 * d["x"].astype(np.float64)
    softmax = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    assert report["metrics"]["output_kind"] == "logits", "rows outside [0, 1] are logits"
    assert report["metrics"]["loss"] == pytest.approx(sk.log_loss(d["class_y"], softmax, labels=[0, 1, 2]), rel=1e-4)
    assert report["metrics"]["accuracy"] == pytest.approx(np.mean(softmax.argmax(1) == d["class_y"]))
    assert report["data"]["inputs"]["x"]["key"] == "features"


GOOD = {"x_test/x": "x", "x_test/offset": "offset", "y_test": "total_y"}  # names of the fixture's arrays


@pytest.mark.unit
@pytest.mark.parametrize(
    "arrays, args, fragment",
    [
        pytest.param(
            GOOD,
            ["--input-map", "x=nope"],
            "has no input 'nope': expected one of offset, x",
            id="input-map-unknown-input",
        ),
        pytest.param({"x_test/x": "x", "y_test": "total_y"}, [], "the data lacks input 'offset'", id="missing-input"),
        pytest.param(
            {"x_test/x": "x64", "x_test/offset": "offset", "y_test": "total_y"},
            [],
            "wants 'x' as float32; the data's 'x' is float64",
            id="dtype",
        ),
        pytest.param(
            {"x_test/x": "x4", "x_test/offset": "offset", "y_test": "total_y"},
            [],
            "wants 'x' shaped float32 [None, 3]; the data's 'x' examples are [4]",
            id="shape",
        ),
        pytest.param(
            {"x_test/x": "x", "x_test/offset": "offset", "y_test": "text"},
            [],
            "does not name its classes (no 'label_names' output): expected integer class ids",
            id="label-names-of-a-model-without-names",
        ),
        pytest.param(
            {"x_test/x": "x", "x_test/offset": "offset", "y_test": "negative"},
            ["--output", "scaled"],
            "expected integer class ids >= 0",
            id="negative-classes",
        ),
        pytest.param(
            GOOD,
            ["--output", "nope"],
            "--output nope: signature 'serving_default' of model 'f' has no such output",
            id="no-output",
        ),
        pytest.param(GOOD, ["--output", "shifted"], "output 'shifted' of signature", id="integer-output"),
        pytest.param(
            GOOD,
            ["--output", "total", "--require", "accuracy>=1"],
            "regression reports no 'accuracy'",
            id="gate-of-another-task",
        ),
        pytest.param(
            GOOD,
            ["--output", "total", "--report", "/proc/r.json"],
            "--report /proc: cannot write there",
            id="unwritable-report",
        ),
    ],
)
def test_bad_input_is_one_line_before_any_predict(foreign, tmp_path, capsys, arrays, args, fragment):
    server, d = foreign
    values = {
        **d,
        "x64": d["x"].astype(np.float64),
        "x4": np.zeros((N, 4), np.float32),
        "text": np.array(["a"] * N),
        "negative": -np.ones(N, np.int64),
    }
    path = _npz(tmp_path, "bad", **{key: values[name] for key, name in arrays.items()})
    before = predict_count(server)
    code = _eval(server, path, *args)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "error:" in err[-1] and fragment in err[-1], err[-1]
    assert predict_count(server) == before, "no Predict was sent"


# --- shards: `--shard I/N` clients, then `trainserve report merge` ----------------------------------------


@pytest.mark.unit
def test_latency_percentiles_from_the_histogram_are_within_two_percent_above():
    from trainserve.evaluation.metrics import latency_histogram, percentiles_from_histogram

    latencies = np.random.default_rng(4).lognormal(1.0, 1.0, 5000)
    exact = np.percentile(latencies, [50, 90, 99], method="inverted_cdf")  # nearest rank
    approximate = percentiles_from_histogram(latency_histogram(latencies))
    assert all(e <= a <= e * 1.02 for e, a in zip(exact, approximate)), (exact, approximate)


@pytest.mark.integration
@pytest.mark.parametrize("task", ["regression", "binary-logits"])
def test_shard_reports_merge_into_the_unsharded_report(foreign, tmp_path, capsys, task):
    server, d = foreign
    total = d["x"].sum(axis=1)
    y = d["total_y"] if task == "regression" else (total + np.random.default_rng(5).normal(size=N) > 0).astype(int)
    path = _npz(tmp_path, "data", **{"x_test/x": d["x"], "x_test/offset": d["offset"], "y_test": y})
    args = ["--output", "total", "--batch-size", "16", "--require", "loss<=10"]
    assert _eval(server, path, *args, report=tmp_path / "full.json") == 0
    shards = [tmp_path / f"shard-{i}.json" for i in range(3)]
    for i, shard in enumerate(shards):
        assert _eval(server, path, *args, "--shard", f"{i}/3", report=shard) == 0
    assert main(["report", "merge", *map(str, shards), "--output", str(tmp_path / "merged.json")]) == 0
    capsys.readouterr()
    full, merged = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("full", "merged"))
    validate_report(merged)
    parts = [json.loads(s.read_text())["data"]["examples"] for s in shards]
    assert sorted(parts) == [96, 96, 108] and merged["data"]["examples"] == N, "19 batches of 16: 7, 6, 6"
    assert merged["performance"]["requests"] == full["performance"]["requests"] == 19
    assert merged["merged"]["shards"] == ["0/3", "1/3", "2/3"] and merged["passed"]
    exact = ["mse", "mae", "r2", "rmse"] if task == "regression" else ["accuracy", "loss", "top_k_accuracy"]
    for name in exact:
        assert merged["metrics"][name] == pytest.approx(full["metrics"][name], rel=1e-9), name
    if task == "binary-logits":
        assert merged["metrics"]["confusion_matrix"] == full["metrics"]["confusion_matrix"]
        assert merged["metrics"]["score_histogram"] == full["metrics"]["score_histogram"]
        for name in ("roc_auc", "average_precision"):  # binned: exact only up to ties within 1/1000
            assert merged["metrics"][name] == pytest.approx(full["metrics"][name], abs=2e-3), name


@pytest.mark.integration
def test_merge_refuses_an_incomplete_or_mixed_set(foreign, tmp_path, capsys):
    server, d = foreign
    path = _npz(tmp_path, "data", **{"x_test/x": d["x"], "x_test/offset": d["offset"], "y_test": d["total_y"]})
    shards = [str(tmp_path / f"{i}.json") for i in range(3)]
    for i, shard in enumerate(shards):
        assert _eval(server, path, "--output", "total", "--shard", f"{i}/3", report=shard) == 0
    other = json.loads(Path(shards[2]).read_text()) | {"version": 7}
    (tmp_path / "other.json").write_text(json.dumps(other))
    out = str(tmp_path / "merged.json")
    for reports, fragment in (
        (shards[:2], "expected each of 0/3, 1/3, 2/3 once (missing 2/3)"),
        ([*shards[:2], str(tmp_path / "other.json")], "has version 7 but"),
        ([*shards, shards[0]], "(repeated 0/3)"),
    ):
        code = main(["report", "merge", *reports, "--output", out])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and fragment in err[-1], err[-1]
        assert not Path(out).exists(), "nothing written"
