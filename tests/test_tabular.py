"""Data as people have it, end to end: iris as CSV (species names as labels, a text column, empty cells)
trains with no encoding by hand, serve-local serves the raw columns, and `trainserve eval --data test.csv
--label-column species` reports accuracy with the class names; REST takes a raw JSON row; served ==
in-process on the same rows. The example is trained once for the module, read-only."""

from __future__ import annotations

import json
import runpy

import grpc
import numpy as np
import pytest

from conftest import QUICK_SWEEP, REPO, run_cli
from serving_fixtures import InProcessServer
from trainserve.cli import main
from trainserve.evidence.document import validate_report
from trainserve.layout import read_metadata, split_input_names

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("tabular")]  # the module trains once (conftest.py)

EXAMPLE = REPO / "examples" / "iris_categories.py"
COLUMNS = ["petal_length", "petal_size", "sepal_length", "sepal_width"]


@pytest.fixture(scope="module")
def iris(tmp_path_factory):
    """The iris example trained (60 epochs of 6 steps: seconds) and served by serve-local."""
    root = tmp_path_factory.mktemp("iris")
    runpy.run_path(str(EXAMPLE))["write_data"](str(root / "csv"))
    proc = run_cli(
        "train",
        "--data",
        root / "csv" / "train.csv",
        "--label-column",
        "species",
        "--model-fn",
        f"{EXAMPLE}:build_model",
        "--model-name",
        "iris",
        "--epochs",
        "60",
        "--batch-size",
        "16",
        "--learning-rate",
        "0.01",
        "--export-base",
        root / "models",
        "--data-dir",
        root / "shared",
        "--logs-dir",
        root / "logs",
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    server = InProcessServer("--model_name=iris", f"--model_base_path={root / 'models' / 'iris'}")
    server.wait_available("iris", 1)
    yield root, server
    assert server.stop() == 0


def _eval(server: InProcessServer, root, *args: str) -> dict:
    report = root / f"report-{abs(hash(args))}.json"
    code = main(["eval", "--server", server.target, "--model", "iris", "--report", str(report), *args])
    assert code == 0
    validate_report(json.loads(report.read_text()))
    return json.loads(report.read_text())


def test_metadata_and_signature_name_the_raw_columns_and_the_classes(iris):
    from trainserve.savedmodel import LoadedModel

    root, _ = iris
    version = root / "models" / "iris" / "1"
    meta = read_metadata(version)
    assert meta["label_names"] == ["setosa", "versicolor", "virginica"]
    wanted, outputs = LoadedModel(version).signature("serving_default")
    assert {k: (v.dtype.name, v.shape) for k, v in wanted.items()} == {
        "petal_length": ("float32", (None,)),
        "sepal_length": ("float32", (None,)),
        "sepal_width": ("float32", (None,)),
        "petal_size": ("object", (None,)),
    }
    assert sorted(outputs) == ["class_names", "classes", "label_names", "probabilities", "unknown_categories"]
    assert meta["signature"]["outputs"] == sorted(outputs), "trainserve.json names what the signature answers"
    assert {i["name"]: i["dtype"] for i in meta["inputs"]}["petal_size"] == "string"
    with np.load(root / "shared" / "iris" / "test.npz") as split:  # strings kept, no pickle
        assert split_input_names(split.files) == COLUMNS and split["x_test/petal_size"].dtype.kind == "U"


def test_eval_on_the_raw_csv_reports_accuracy_by_class_name_and_unseen_categories(iris, capsys):
    root, server = iris
    report = _eval(server, root, "--data", str(root / "csv" / "test.csv"), "--label-column", "species")
    out = capsys.readouterr().out
    assert report["metrics"]["accuracy"] >= 0.85, report["metrics"]
    assert report["data"]["label_names"] == ["setosa", "versicolor", "virginica"]
    assert [row["label"] for row in report["metrics"]["per_class"]] == ["setosa", "versicolor", "virginica"]
    assert report["data"]["unknown_categories"] == {"values": 1, "examples": 1}  # the one "tiny" petal
    assert "virginica" in out and "unseen categories" in out


def test_served_equals_in_process_and_rest_takes_a_raw_json_row(iris):
    """gRPC (via eval --compare-local), REST rows and the SavedModel run in this process agree exactly."""
    from trainserve.evaluation.data import open_eval_data
    from trainserve.evaluation.plan import text_as
    from trainserve.savedmodel import LoadedModel

    root, server = iris
    report = _eval(
        server,
        root,
        "--data",
        str(root / "csv" / "test.csv"),
        "--label-column",
        "species",
        "--compare-local",
        str(root / "models" / "iris" / "1"),
    )
    assert report["compare_local"]["max_abs_diff"] == 0.0 and report["compare_local"]["class_agreement"] == 1.0

    data = open_eval_data(str(root / "csv" / "test.csv"), label_column="species")
    columns, _ = next(data.batches(5))
    local = LoadedModel(root / "models" / "iris" / "1")
    dtypes = {k: v.dtype for k, v in local.signature("serving_default")[0].items()}
    want = local.run("serving_default", {k: text_as(v, dtypes[k], k) for k, v in columns.items()})
    # The CSV rows as JSON instances: text as it is, numbers as numbers (an empty cell as NaN).
    rows = [
        {k: str(v[i]) if dtypes[k].kind == "O" else float(v[i] or "nan") for k, v in columns.items()} for i in range(5)
    ]
    code, body = server.post("/v1/models/iris:predict", {"instances": rows})
    assert code == 200, body
    got = body["predictions"]
    np.testing.assert_allclose([r["probabilities"] for r in got], want["probabilities"], atol=1e-6)
    assert [r["class_names"] for r in got] == [v.decode() for v in want["class_names"]]
    assert got[0]["label_names"] == ["setosa", "versicolor", "virginica"], "a row's [K] strings stay a list"
    assert [v.decode() for v in want["label_names"][0]] == ["setosa", "versicolor", "virginica"]


def test_eval_on_the_shared_split_and_label_names_the_model_lacks(iris, tmp_path, capsys):
    root, server = iris
    report = _eval(server, root, "--data", str(root / "shared" / "iris" / "test.npz"))
    assert report["metrics"]["accuracy"] >= 0.85 and report["data"]["label_names"][0] == "setosa"
    bad = tmp_path / "bad.csv"
    lines = (root / "csv" / "test.csv").read_text().splitlines()
    bad.write_text("\n".join([lines[0], lines[1].rsplit(",", 1)[0] + ",daisy", *lines[2:]]) + "\n")
    code = main(["eval", "--server", server.target, "--model", "iris", "--data", str(bad), "--label-column", "species"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and "label names daisy are not classes of" in err[-1] and "setosa" in err[-1], err


def test_load_on_the_raw_csv_checks_answers_against_the_class_names(iris, tmp_path):
    root, server = iris
    code = main(
        [
            *("load", "--server", server.target, "--model", "iris", "--batch-sizes", "4", *QUICK_SWEEP),
            *("--data", str(root / "csv" / "test.csv"), "--label-column", "species"),
            *("--report", str(tmp_path / "load.json")),
        ]
    )
    assert code == 0
    (point,) = json.loads((tmp_path / "load.json").read_text())["points"]
    assert point["quality"]["accuracy"] >= 0.85, point["quality"]


def test_grpc_predict_with_a_missing_number_and_an_empty_category_answers(iris):
    from trainserve.protos import model_pb2, predict_pb2, prediction_service_pb2_grpc
    from trainserve.tensors import from_tensor_proto, to_tensor_proto

    _, server = iris
    request = predict_pb2.PredictRequest(model_spec=model_pb2.ModelSpec(name="iris"))
    row = {
        "sepal_length": np.float32([5.9]),
        "sepal_width": np.float32([np.nan]),
        "petal_length": np.float32([4.2]),
        "petal_size": np.array([b""], dtype=object),
    }
    for key, value in row.items():
        request.inputs[key].CopyFrom(to_tensor_proto(value))
    with grpc.insecure_channel(server.target) as channel:
        answer = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
    probabilities = from_tensor_proto(answer.outputs["probabilities"])
    assert probabilities.shape == (1, 3) and np.isfinite(probabilities).all()
    assert from_tensor_proto(answer.outputs["unknown_categories"]).tolist() == [0]  # missing is not unseen


def test_the_export_child_a_gpu_machine_uses_carries_the_preprocessing_and_the_strings(tmp_path):
    """With a GPU visible, export and gate run in one child process that sees none: the spec (vocabularies,
    statistics) and the golden batch's text go through files, and the gate still passes."""
    import keras

    from trainserve.sources import load_dataset
    from trainserve.training.export import ExportJob, export_and_gate, serving_outputs
    from trainserve.training.gate import GoldenBatch
    from trainserve.training.model import build_network
    from trainserve.training.model_fn import data_spec, input_structure

    runpy.run_path(str(EXAMPLE))["write_data"](str(tmp_path))
    ds = load_dataset(str(tmp_path / "train.csv"), label_column="species")
    spec = data_spec(ds.train, ds.task, tabular=True)
    keras.utils.set_random_seed(0)
    model = build_network(f"{EXAMPLE}:build_model", spec)
    inputs = {k: v[:8] for k, v in ds.test.items()}
    outputs = serving_outputs(model(input_structure(model)(inputs), training=False), ds.task)
    golden = GoldenBatch(inputs, {k: np.asarray(v) for k, v in outputs.items()})
    job = ExportJob(f"{EXAMPLE}:build_model", spec, model.get_weights(), golden, 1e-4)
    result = export_and_gate(job, tmp_path / "1", in_process=False)
    assert result.ok, result.reason
    assert result.checked == "golden batch of 8"
