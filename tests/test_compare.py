"""`trainserve eval --compare-with`: two versions served side by side (`model_version_policy { all {} }`) on a
real serve-local, every batch sent to both, and the paired verdict checked against an independent computation.

- digits v1 is the session's 5-epoch model, v2 the same network after one epoch: v2 must be called worse.
- syn v1 and v2 are one training run twice with different seeds on a task both learn (templates plus noise,
  2,000 evaluated examples): neither gets an example wrong that the other gets right often enough to be a
  difference, so the verdict must be "no significant difference". What this shows: the comparison does not
  invent a difference between equally good versions; it does not show the test's power against small ones
  (test_gates.py checks the statistics themselves against scipy).
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from scipy import stats

from conftest import digits_cnn, export_digits_cnn, install_version, predict_count, save_foreign_model
from serving_fixtures import InProcessServer
from trainserve.cli import main
from trainserve.evaluation.preflight import default_margin
from trainserve.evaluation.report import describe_gate
from trainserve.evidence.document import validate_report
from trainserve.savedmodel import LoadedModel
from trainserve.sources import load_dataset
from trainserve.sources.synthetic import SyntheticSpec, synthetic_examples

# serve-local on a thread of this process, real gRPC; the module trains once (conftest.py)
pytestmark = pytest.mark.xdist_group("compare")
SYN = SyntheticSpec((8, 8, 1), 10, 2000)


def fit_cnn(x: np.ndarray, y: np.ndarray, epochs: int, seed: int, path):
    """The built-in CNN fitted as `trainserve train` compiles it, exported with trainserve's signature."""
    import keras

    keras.utils.set_random_seed(seed)
    model = digits_cnn()
    model.compile(keras.optimizers.Adam(3e-3), "sparse_categorical_crossentropy")
    model.fit(x, y, batch_size=64, epochs=epochs, verbose=0, shuffle=True)
    return export_digits_cnn(model, path)


@pytest.fixture(scope="module")
def side_by_side(trained_digits, tmp_path_factory):
    """serve-local with digits v1 (5 epochs), v2 (1 epoch), v3 (another signature) and syn v1, v2 (two seeds),
    every version loaded, `stable` on digits v1."""
    root = tmp_path_factory.mktemp("compare")
    digits = load_dataset("digits")
    install_version(trained_digits / "models" / "digits" / "1", root / "digits", 1)
    install_version(fit_cnn(digits.x_train, digits.y_train, 1, 0, root / "one-epoch"), root / "digits", 2)
    install_version(save_foreign_model(root / "foreign"), root / "digits", 3)
    x, y = synthetic_examples(SYN, 1500, 7)
    for version in (1, 2):
        install_version(fit_cnn(x, y, 3, version, root / f"syn-{version}"), root / "syn", version)
    config = root / "models.config"
    config.write_text(
        "model_config_list {\n"
        + "".join(
            f'  config {{ name: "{m}" base_path: "{root / m}" model_platform: "tensorflow" '
            f"model_version_policy {{ all {{}} }} {labels} }}\n"
            for m, labels in (("digits", 'version_labels { key: "stable" value: 1 }'), ("syn", ""))
        )
        + "}\n"
    )
    (root / "monitoring.config").write_text("prometheus_config { enable: true }\n")
    server = InProcessServer(
        f"--model_config_file={config}",
        "--allow_version_labels_for_unavailable_models",
        f"--monitoring_config_file={root / 'monitoring.config'}",
    )
    for model, version in (("digits", 1), ("digits", 2), ("digits", 3), ("syn", 1), ("syn", 2)):
        server.wait_available(model, version)
    yield server, root, trained_digits / "data" / "digits" / "test.npz"
    assert server.stop() == 0


def eval_cli(server, tmp_path, *args) -> tuple[int, dict | None]:
    report = tmp_path / "eval.json"
    code = main(["eval", "--server", server.target, "--report", str(report), "--batch-size", "64", *map(str, args)])
    return code, json.loads(report.read_text()) if report.is_file() else None


@pytest.mark.integration
def test_one_epoch_version_is_worse_than_the_trained_one(side_by_side, tmp_path, capsys):
    server, root, split = side_by_side
    flags = ("--compare-with", 1, "--max-drop", "none")  # no margin: only "not significantly worse"
    code, report = eval_cli(server, tmp_path, "--model", "digits", "--version", 2, *flags, "--data", split)
    out = capsys.readouterr()
    validate_report(report)
    c = report["comparison"]
    assert code == 1 and "not significantly worse" in out.out and "FAIL" in out.out
    assert c["verdict"] == "worse" and c["test"]["p_value"] < 0.05
    assert out.out.splitlines()[0].startswith("v2 vs v1: worse (p=") and "McNemar" in out.out.splitlines()[0]
    assert "is significantly worse than version 1" in out.err.strip().splitlines()[-1]
    # Independently: both SavedModels run in this process on the same split, McNemar by scipy.
    with np.load(split) as npz:
        images, labels = npz["x_test"], npz["y_test"]
    right = [
        LoadedModel(root / "digits" / str(v)).run("serving_default", {"images": images})["classes"] == labels
        for v in (2, 1)
    ]
    b, d = int(np.sum(right[0] & ~right[1])), int(np.sum(~right[0] & right[1]))
    assert (c["test"]["discordant"]["candidate_only"], c["test"]["discordant"]["baseline_only"]) == (b, d)
    assert c["test"]["p_value"] == pytest.approx(stats.binomtest(b, b + d, 0.5).pvalue, rel=1e-9)
    accuracy = c["metrics"]["accuracy"]
    assert (accuracy["candidate"], accuracy["baseline"]) == pytest.approx((right[0].mean(), right[1].mean()))
    assert accuracy["interval"][0] <= accuracy["difference"] <= accuracy["interval"][1] < 0
    assert report["metrics"]["accuracy"] == pytest.approx(right[0].mean())
    # Both versions answered every batch: latency of each, side by side.
    assert c["latency_ms"]["candidate"]["p50"] > 0 and c["latency_ms"]["baseline"]["p50"] > 0
    assert (tmp_path / "eval.html").is_file()


@pytest.mark.integration
def test_two_seeds_of_one_training_are_no_significant_difference(side_by_side, tmp_path, capsys, caplog):
    server, _, _ = side_by_side
    code, report = eval_cli(
        server,
        tmp_path,
        "--model",
        "syn",
        "--version",
        2,
        "--compare-with",
        1,
        "--data",
        "synthetic",
        "--synthetic-shape",
        "8,8,1",
        "--synthetic-size",
        SYN.size,
    )
    c = report["comparison"]
    assert code == 0, capsys.readouterr()
    assert c["verdict"] == "no significant difference" and c["test"]["p_value"] >= 0.05
    assert min(c["metrics"]["accuracy"]["candidate"], c["metrics"]["accuracy"]["baseline"]) >= 0.98
    assert report["data"]["examples"] == SYN.size
    (gate,) = report["gates"]  # no --max-drop: the default margin, said so
    assert (gate["kind"], gate["default_margin"], gate["basis"]) == ("non-inferiority", True, "bound")
    expected = default_margin(SYN.size, 0.03)  # the rule at eval's assumed discordance, before any request
    assert gate["margin"] == expected.drop and c["preflight"]["assumed"]["default_margin"]["margin"] == expected.drop
    assert report["passed"] is True and "[bound, default margin]: PASS" in capsys.readouterr().out
    said = f"no --max-drop: gating on the default margin {expected.describe()}: the smallest margin {SYN.size:,} "
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith(said)], "one line says which"


@pytest.mark.integration
def test_the_margin_gate_fails_the_worse_version_and_passes_an_equal_one(side_by_side, tmp_path, capsys):
    """--max-drop replaces "not significantly worse": the one-epoch version is shown worse than a 1-point margin
    allows (or the data cannot tell), two seeds of one training on 2,000 examples are shown within it."""
    server, _, split = side_by_side
    code, report = eval_cli(
        server,
        tmp_path,
        "--model",
        "digits",
        "--version",
        2,
        "--compare-with",
        1,
        "--data",
        split,
        "--max-drop",
        "accuracy=0.01",
    )
    out = capsys.readouterr()
    validate_report(report)
    (gate,) = report["gates"]
    accuracy = report["comparison"]["metrics"]["accuracy"]
    assert gate["kind"] == "non-inferiority" and gate["verdict"] in ("inferior", "inconclusive") and code == 1
    assert gate["value"] == pytest.approx(accuracy["interval"][0]) and gate["margin"] == 0.01
    assert gate["mdd"] == accuracy["mdd"] > 0 and "detectable with 80% power" in out.out
    assert f"accuracy is {gate['verdict']} to version 1" in out.err
    code, report = eval_cli(
        server,
        tmp_path,
        "--model",
        "syn",
        "--version",
        2,
        "--compare-with",
        1,
        "--data",
        "synthetic",
        "--synthetic-shape",
        "8,8,1",
        "--synthetic-size",
        SYN.size,
        "--max-drop",
        "accuracy=0.01",
    )
    (gate,) = report["gates"]
    assert (gate["verdict"], gate["passed"], code) == ("non-inferior", True, 0), gate
    assert report["intervals"]["accuracy"]["interval"][0] < report["metrics"]["accuracy"] <= 1


class PredictsSoFar(logging.Handler):
    """Records, as each pre-flight line is logged, how many Predict calls the server has answered by then."""

    def __init__(self, server):
        super().__init__()
        self.server, self.lines = server, []

    def emit(self, record):
        self.lines.append((record.getMessage(), predict_count(self.server)))


@pytest.mark.unit
def test_the_preflight_speaks_before_any_predict_and_require_power_sends_nothing(side_by_side, tmp_path, capsys):
    """A 0.5-point margin on digits' held-out split is below what its examples can decide: the line comes before
    the first Predict (the server's own count, read as the line is logged); --require-power refuses, sending none."""
    server, _, split = side_by_side
    args = ("--model", "digits", "--version", 2, "--compare-with", 1, "--data", split, "--max-drop", "accuracy=0.005")
    recorder, logger = PredictsSoFar(server), logging.getLogger("trainserve.evaluation.preflight")
    logger.addHandler(recorder)
    before = predict_count(server)
    try:
        code, report = eval_cli(server, tmp_path, *args)
    finally:
        logger.removeHandler(recorder)
    ((line, predicts),) = recorder.lines
    n = report["data"]["examples"]
    assert line.startswith(f"pre-flight: {n} examples at a discordance of 0.03") and "accuracy=0.005 is below" in line
    assert predicts == before < predict_count(server) and code == 1
    section = report["comparison"]["preflight"]
    discordant = report["comparison"]["test"]["discordant"]
    assert section["observed"]["discordance"] == (discordant["candidate_only"] + discordant["baseline_only"]) / n
    assert section["assumed"]["smallest_margin"] > 0.005 and "power           " in capsys.readouterr().out
    before = predict_count(server)
    code, report = eval_cli(server, tmp_path / "refused", *args, "--require-power")
    assert (code, report, predict_count(server)) == (2, None, before)
    (error,) = capsys.readouterr().err.strip().splitlines()[-1:]
    assert error.startswith("trainserve eval: error: pre-flight:") and "--require-power refuses" in error


@pytest.mark.integration
def test_slices_of_an_npz_key_gate_the_run_and_equal_versions_pass(side_by_side, tmp_path, capsys):
    """--slice region (an npz key beside x_test) with --gate-slices: the one-epoch version's worse slices are named
    with their corrected p-values and fail the run; two seeds of one training pass per class (the default)."""
    server, _, split = side_by_side
    with np.load(split) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays["region"] = np.where(arrays["y_test"] % 2 == 0, "even", "odd")
    sliced = tmp_path / "sliced.npz"
    np.savez(sliced, **arrays)
    code, report = eval_cli(
        server,
        tmp_path,
        "--model",
        "digits",
        "--version",
        2,
        "--compare-with",
        1,
        "--data",
        sliced,
        "--slice",
        "region",
        "--slice",
        "region,class",
        "--gate-slices",
        "--max-drop-per-slice",
        "accuracy=0.05",
        "--not-worse=false",
    )
    out = capsys.readouterr()
    validate_report(report)
    table = report["comparison"]["slices"]
    names = {r["name"] for r in table["rows"]}
    assert {"region=even", "region=odd", "region=even,class=0", "class=0"} <= names and len(names) == 2 + 10 + 10
    assert table["worse"] and code == 1
    assert [g["kind"] for g in report["gates"]] == ["non-inferiority", "slice", "slice-non-inferiority"]
    assert report["gates"][2]["passed"] is False and set(report["gates"][2]["slices"]) >= set(table["worse"])
    worst = table["rows"][0]
    assert worst["name"] in table["worse"] and worst["p_adjusted"] < 0.05 and worst["direction"] == "worse"
    assert f"significantly worse on {worst['name']} (n={worst['examples']}" in report["comparison"]["verdict_line"]
    assert "significantly worse than version 1 on" in out.err
    code, report = eval_cli(
        server,
        tmp_path,
        "--model",
        "syn",
        "--version",
        2,
        "--compare-with",
        1,
        "--data",
        "synthetic",
        "--synthetic-shape",
        "8,8,1",
        "--synthetic-size",
        SYN.size,
        "--gate-slices",
    )
    table = report["comparison"]["slices"]
    assert (code, table["worse"], len(table["rows"])) == (0, [], 10), table
    assert report["gates"][-1]["kind"] == "slice" and report["gates"][-1]["passed"] is True
    assert describe_gate(report["gates"][-1]) == (
        "no slice significantly worse than v1 (holm): worse on none [absence of evidence: cannot promote alone]"
    )


@pytest.mark.unit
def test_a_label_names_the_baseline_and_change_thresholds_gate(side_by_side, tmp_path):
    server, _, split = side_by_side
    flags = ("--max-drop", "none", "--not-worse=false", "--require-vs-baseline", "accuracy>=-90%")  # change only
    code, report = eval_cli(
        server, tmp_path, "--model", "digits", "--version", 2, "--compare-with", "stable", "--data", split, *flags
    )
    assert report["comparison"]["baseline"] == {"reference": "stable", "version": 1}
    assert [g["kind"] for g in report["gates"]] == ["change"] and code == 0, report["gates"]


def first_rollout_args(config) -> tuple:
    return (
        "--model",
        "syn",
        "--compare-with",
        "stable",
        "--allow-no-baseline",
        "--rollout-config",
        config,
        "--data",
        "synthetic",
        "--synthetic-shape",
        "8,8,1",
        "--synthetic-size",
        64,
        "--min-accuracy",
        "0.5",
    )


@pytest.mark.unit
def test_first_rollout_passes_on_its_value_gates_when_the_config_says_so(side_by_side, tmp_path):
    server, root, _ = side_by_side
    code, report = eval_cli(server, tmp_path, *first_rollout_args(root / "models.config"))
    assert code == 0 and report["comparison"]["verdict"] == "no baseline"
    assert "labels no 'stable' version of model syn: a first rollout" in report["comparison"]["verdict_line"]
    assert [g["metric"] for g in report["gates"]] == ["accuracy"] and "kind" not in report["gates"][0]
    assert report["evidence"]["baseline"]["version"] is None


@pytest.mark.unit
def test_a_stable_the_server_cannot_answer_for_fails_the_eval_with_its_error(side_by_side, tmp_path, capsys):
    """The config labels syn's stable (version 2), the server resolves no such label: not a first rollout."""
    server, root, _ = side_by_side
    labelled = tmp_path / "labelled.config"
    labelled.write_text(
        (root / "models.config")
        .read_text()
        .replace("{ all {} }  }", '{ all {} } version_labels { key: "stable" value: 2 } }')
    )
    assert 'key: "stable" value: 2' in labelled.read_text()
    code, report = eval_cli(server, tmp_path, *first_rollout_args(labelled), "--wait", 0)
    err = capsys.readouterr().err.strip()
    assert code == 2 and report is None and len(err.splitlines()) == 1, err
    assert "label 'stable' of model syn resolves to nothing" in err and "expected version 2" in err, err
    assert "NOT_FOUND" in err or "INVALID_ARGUMENT" in err, err


@pytest.mark.unit
def test_no_baseline_needs_the_config_and_never_comes_from_a_failed_lookup(side_by_side, tmp_path, capsys):
    server, _, _ = side_by_side
    args = first_rollout_args("unused")
    without_config = args[: args.index("--rollout-config")] + args[args.index("--rollout-config") + 2 :]
    code, _ = eval_cli(server, tmp_path, *without_config)
    assert code == 2 and "--allow-no-baseline: expected --rollout-config FILE" in capsys.readouterr().err
    no_allow = tuple(a for a in without_config if a != "--allow-no-baseline")
    code, _ = eval_cli(server, tmp_path, *no_allow)
    err = capsys.readouterr().err
    assert code == 2 and "resolves no version for label 'stable' of model 'syn'" in err, err


@pytest.mark.unit
@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        pytest.param(("--version", 2, "--compare-with", 9), "has no version 9 on", id="version-not-served"),
        pytest.param(("--version", 2, "--compare-with", "nope"), "no version for label 'nope'", id="label-not-served"),
        pytest.param(("--version", 1, "--compare-with", "stable"), "the version evaluated", id="itself"),
        pytest.param(("--version", 1, "--compare-with", 3), "differ in inputs", id="other-signature"),
        pytest.param(
            ("--version", 2, "--compare-with", 1, "--require-vs-baseline", "mse<=0"),
            "classification compares accuracy, top_k_accuracy, loss",
            id="gate-on-another-task",
        ),
        pytest.param(
            ("--version", 2, "--require-vs-baseline", "accuracy>=0"), "without --compare-with", id="change-gate-alone"
        ),
        pytest.param(("--version", 2, "--compare-with", 1, "--shard", "0/2"), "expected no --shard", id="shard"),
    ],
)
def test_bad_comparisons_fail_in_one_line_before_any_predict(side_by_side, tmp_path, capsys, args, fragment):
    server, _, split = side_by_side
    before = predict_count(server)
    code, report = eval_cli(server, tmp_path, "--model", "digits", "--data", split, "--wait", 5, *args)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and report is None
    assert err[-1].startswith("trainserve eval: error:") and fragment in err[-1], err
    assert predict_count(server) == before, "refused before any Predict"
