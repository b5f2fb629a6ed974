"""Your own model and data (`--model-fn`, named inputs, regression): the examples train, pass the CPU gate,
publish, and `trainserve eval` over real gRPC reports the metrics scikit-learn computes in-process on the
same split; the shared split carries the task and the named inputs; bad input is one line."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, run_cli
from serving_fixtures import InProcessServer
from trainserve.cli import main
from trainserve.evidence.document import validate_report
from trainserve.layout import read_metadata, read_task, split_input_names, split_task

EXAMPLES = REPO / "examples"

# (example file, epochs, inputs and their dtypes, task kind, the metric that shows it learned)
CASES = {
    "diabetes_regression": (20, {"x": "float32"}, "regression", ("test_mae", lambda v: v < 0.75)),
    "breast_cancer_two_inputs": (
        "8 --learning-rate 0.01",
        {"features": "float32", "radius_bucket": "int64"},
        "classification",
        ("test_accuracy", lambda v: v > 0.8),
    ),
    "digits_rows_lstm": (8, {"x": "float32"}, "classification", ("test_accuracy", lambda v: v > 0.5)),
}


@pytest.mark.integration
@pytest.mark.parametrize("example", sorted(CASES))
def test_example_trains_passes_the_gate_and_publishes(example, tmp_path):
    from trainserve.savedmodel import LoadedModel

    epochs, inputs, kind, (metric, learned) = CASES[example]
    data = tmp_path / f"{example}.npz"
    runpy.run_path(str(EXAMPLES / f"{example}.py"))["write_data"](str(data))
    proc = run_cli(
        "train",
        "--data",
        data,
        "--model-fn",
        f"{EXAMPLES / example}.py:build_model",
        "--model-name",
        "m",
        "--epochs",
        *str(epochs).split(),
        "--export-base",
        tmp_path / "models",
        "--data-dir",
        tmp_path / "shared",
        "--logs-dir",
        tmp_path / "logs",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CPU gate passed" in proc.stderr
    version = tmp_path / "models" / "m" / "1"
    meta = read_metadata(version)
    assert read_task(version).kind == kind and meta["task"]["kind"] == kind
    assert {i["name"]: i["dtype"] for i in meta["inputs"]} == inputs
    assert learned(meta["metrics"][metric]), meta["metrics"]
    print(f"{example}: {json.dumps(meta['metrics'])}")

    model = LoadedModel(version)
    wanted, outputs = model.signature("serving_default")
    assert {k: v.dtype.name for k, v in wanted.items()} == inputs
    named = ["class_names", "label_names"] if read_task(version).named_classes else []  # breast cancer's
    classification = sorted(["classes", "probabilities", *named])
    assert sorted(outputs) == (["predictions"] if kind == "regression" else classification)
    with np.load(tmp_path / "shared" / "m" / "test.npz") as split:
        task = split_task(split)
        assert task == read_task(version)
        feed = {n: split[f"x_test/{n}"] for n in split_input_names(split.files)} or {"x": split["x_test"]}
        answer = model.run("serving_default", feed)
        if kind == "regression":
            assert answer["predictions"].shape == (len(split["y_test"]), task.targets)
        else:
            assert answer["probabilities"].shape == (len(split["y_test"]), task.classes)
            accuracy = float(np.mean(answer["classes"] == split["y_test"]))
            assert accuracy == pytest.approx(meta["metrics"]["test_accuracy"], abs=1e-6), "served == in-process"
    verify = run_cli("verify", version)
    assert verify.returncode == 0 and "OK on CPU" in verify.stdout, verify.stderr[-2000:]
    served = _served_report(tmp_path, tmp_path / "shared" / "m" / "test.npz")
    in_process = _metrics(kind, split_y(tmp_path), answer)
    print(f"{example}: served {served['metrics']} vs in-process {in_process}")
    for name, value in in_process.items():
        assert served["metrics"][name] == pytest.approx(value, rel=1e-4, abs=1e-6), name


def split_y(tmp_path: Path) -> np.ndarray:
    with np.load(tmp_path / "shared" / "m" / "test.npz") as split:
        return split["y_test"]


def _served_report(tmp_path: Path, split: Path) -> dict:
    """`trainserve eval` of the published model over real gRPC (serve-local), on the shared split."""
    server = InProcessServer("--model_name=m", f"--model_base_path={tmp_path / 'models' / 'm'}")
    try:
        server.wait_available("m", 1)
        code = main(
            [
                "eval",
                "--server",
                server.target,
                "--model",
                "m",
                "--data",
                str(split),
                "--batch-size",
                "32",
                "--report",
                str(tmp_path / "report.json"),
            ]
        )
        assert code == 0
    finally:
        assert server.stop() == 0
    report = json.loads((tmp_path / "report.json").read_text())
    validate_report(report)
    return report


def _metrics(kind: str, y: np.ndarray, answer: dict) -> dict:
    """The task's metrics computed in-process by scikit-learn, independently of trainserve's."""
    from sklearn import metrics as sk

    if kind == "regression":
        predictions = answer["predictions"]
        return {
            "mse": sk.mean_squared_error(y, predictions),
            "mae": sk.mean_absolute_error(y, predictions),
            "r2": sk.r2_score(y, predictions),
        }
    probabilities = answer["probabilities"].astype(np.float64)
    found = {
        "accuracy": sk.accuracy_score(y, answer["classes"]),
        "loss": sk.log_loss(y, probabilities, labels=range(probabilities.shape[1])),
    }
    if probabilities.shape[1] == 2:
        found["roc_auc"] = sk.roc_auc_score(y, probabilities[:, 1])
        found["average_precision"] = sk.average_precision_score(y, probabilities[:, 1])
    return found


TINY_RAW = """
import keras

def build_model(spec):
    # raw_inputs: the CSV's columns as they are (float32 [N], NaN where a cell was empty), not `features`
    inputs = spec.keras_inputs()
    filled = [keras.ops.reshape(keras.ops.nan_to_num(inputs[n]), (-1, 1)) for n in spec.names]
    return keras.Model(inputs, keras.layers.Dense(spec.output_units)(keras.layers.Concatenate()(filled)))

build_model.raw_inputs = True
"""


@pytest.mark.integration
def test_csv_regression_with_a_model_that_asks_for_the_raw_columns(tmp_path):
    from trainserve.hashed_split import HashedSplit, csv_row_digests, default_salt
    from trainserve.savedmodel import LoadedModel

    rng = np.random.default_rng(0)
    rows = ["area,rooms,price"] + [
        f"{a:.3f},{r if i % 7 else ''},{a * 2 + (r or 0):.3f}"
        for i, (a, r) in enumerate(zip(rng.random(120), rng.integers(1, 5, 120)))
    ]
    (tmp_path / "houses.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "tiny.py").write_text(TINY_RAW)
    proc = run_cli(
        "train",
        "--data",
        "houses.csv",
        "--label-column",
        "price",
        "--model-fn",
        "tiny.py:build_model",
        "--epochs",
        "1",
        "--export-base",
        "models",
        "--data-dir",
        "shared",
        "--logs-dir",
        "logs",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    header, *body = (row.split(",") for row in rows)  # the rows the model's salt holds out (hashed_split)
    held_out = HashedSplit(default_salt("digits"), 0.2).held_out(csv_row_digests(header, body, None))
    with np.load(tmp_path / "shared" / "digits" / "test.npz") as split:
        assert split_input_names(split.files) == ["area", "rooms"] and len(split["y_test"]) == held_out.sum()
        assert split["x_test/rooms"].dtype == np.float32 and split_task(split).kind == "regression"
        feed = {name: split[f"x_test/{name}"] for name in ("area", "rooms")}
    model = LoadedModel(tmp_path / "models" / "digits" / "1")
    wanted, outputs = model.signature("serving_default")
    assert {k: (v.dtype.name, v.shape) for k, v in wanted.items()} == {
        "area": ("float32", (None,)),
        "rooms": ("float32", (None,)),
    }
    assert sorted(outputs) == ["predictions"] and np.isfinite(model.run("serving_default", feed)["predictions"]).all()


BAD_MODELS = """
import keras

def not_a_model(spec):
    return 42

def wrong_names(spec):
    inputs = keras.Input((8, 8, 1), name="pixels")
    return keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(keras.layers.Flatten()(inputs)))

def wrong_width(spec):
    inputs = spec.keras_inputs()
    return keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Flatten()(inputs["images"])))
"""


@pytest.mark.unit
@pytest.mark.parametrize(
    "args, fragment",
    [
        pytest.param(["--model-fn", "nope.py:f"], "file nope.py not found", id="missing-file"),
        pytest.param(["--model-fn", "no_such_pkg.models:f"], "module 'no_such_pkg' not found", id="missing-module"),
        pytest.param(["--model-fn", "bad.py:missing"], "has no function 'missing'", id="missing-function"),
        pytest.param(["--model-fn", "bad.py"], "expected path/to/file.py:function", id="no-function"),
        pytest.param(["--model-fn", "bad.py:not_a_model"], "returned int: expected a keras.Model", id="not-a-model"),
        pytest.param(["--model-fn", "bad.py:wrong_names"], "model inputs ['pixels'] do not match", id="names"),
        pytest.param(["--model-fn", "bad.py:wrong_width"], "expected [N, 10] probabilities", id="width"),
        pytest.param(["--data", "labels.npz"], "expected 1-D integer labels (classification) or float", id="labels"),
        pytest.param(["--data", "t.csv"], "needs --label-column NAME", id="csv-no-label-flag"),
        pytest.param(["--data", "t.csv", "--label-column", "y"], "has no column 'y'", id="csv-no-label-column"),
        pytest.param(
            ["--data", "t.csv", "--label-column", "b", "--architecture", "cnn"],
            "built-in cnn classifies images",
            id="csv-cnn",
        ),
    ],
)
def test_bad_model_or_data_is_one_line(args, fragment, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("bad.py").write_text(BAD_MODELS)
    Path("t.csv").write_text("a,b\n" + "".join(f"{i},{2 + 2 * (i % 2)}\n" for i in range(1, 11)))
    x = np.zeros((4, 3), np.float32)
    np.savez("labels.npz", x_train=x, y_train=np.array(["a"] * 4), x_test=x, y_test=np.array(["a"] * 4))
    code = main(["train", "--epochs", "1", "--export-base", "models", "--logs-dir", "logs", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert "error:" in err[-1] and fragment in err[-1], err[-1]
    assert not list(Path("models").glob("*/[0-9]*")), "nothing published"
