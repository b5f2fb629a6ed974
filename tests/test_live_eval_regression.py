"""`trainserve live-eval` for a regression model, on captures written as capture writes them: MSE, RMSE and MAE
per version, window and slice against numpy on the recorded answers and the labels the test wrote, their intervals
against Hall's skew-corrected t computed from the values (test_skewed_means), --max-drop mse/mae paired and
unpaired (the skew-corrected Welch interval), the bad rows of a labels file of numbers, the shards' merge, and the
flags refused for regression."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_live_eval import T0, live_eval, write_labels
from test_skewed_means import hall_one, hall_two

from captures import capture_name, prediction_log, write_capture
from trainserve.cli import main
from trainserve.live.gates import MIN_PAIRED
from trainserve.live.report import validate_report

REQUESTS, ROWS = 60, 2


def record_regression(data_dir: Path, model: str = "m") -> None:
    """What training leaves for a one-target regression model: its version record, naming the task."""
    (data_dir / model / "versions").mkdir(parents=True, exist_ok=True)
    record = {"task": {"kind": "regression", "classes": 0, "targets": 1}, "test_split": {}}
    (data_dir / model / "versions" / "1.json").write_text(json.dumps(record))


def write_regression_traffic(tmp_path: Path, shadow: bool = True, worse: float = 0.0, seed: int = 0) -> tuple:
    """REQUESTS requests of ROWS rows answered by versions 1 and 2 (both: shadowed; else alternating), version 2's
    answers `worse` further from the truth on average; every 4th request answered twice by its version (a retry:
    the first answer is scored). Returns ({(version, id, row): first prediction}, {(id, row): truth})."""
    rng = np.random.default_rng(seed)
    truth = {(f"req-{i:04d}", row): float(rng.normal(10, 3)) for i in range(REQUESTS) for row in range(ROWS)}
    records, predicted = [], {}
    for i in range(REQUESTS):
        request_id = f"req-{i:04d}"
        for version in (1, 2) if shadow else ((1, 2)[i % 2],):
            noise = rng.normal(0, 1 + worse * (version == 2), ROWS)
            answer = np.array([truth[(request_id, r)] for r in range(ROWS)]) + noise
            for repeat in range(2 if i % 4 == 0 else 1):
                records.append(
                    prediction_log(
                        "m",
                        {"x": np.full((ROWS, 1), i, np.float32), "region": np.array([["eu", "us"][i % 2]] * ROWS)},
                        version=version,
                        request_id=request_id,
                        timestamp_s=T0 + i * 1800,
                        outputs={"predictions": (answer + repeat).astype(np.float32)[:, None]},
                    )
                )
                if repeat == 0:
                    for row in range(ROWS):
                        predicted[(version, request_id, row)] = float(np.float32(answer[row]))
    write_capture(tmp_path / "cap" / capture_name(0), records)
    record_regression(tmp_path)
    return predicted, truth


@pytest.fixture
def regression(tmp_path):
    """Shadowed traffic (version 2's errors twice as spread); labels for a known subset with every kind of
    mismatch."""
    predicted, truth = write_regression_traffic(tmp_path, worse=1.0)
    labelled, rows = {}, []
    for (rid, row), value in truth.items():
        if (int(rid[4:]) + row) % 5 == 0:
            continue  # the label never came
        labelled[(rid, row)] = value
        rows.append((rid, row, repr(value), ["web", "app"][row]))
    rows += [rows[3], rows[7]]  # agreeing duplicates: counted once (three repeated rows with the conflicting one)
    conflicted = rows[10][:2]
    rows.append((*conflicted, "123.5", "web"))  # a conflicting label: not scored
    del labelled[conflicted]
    rows += [
        ("req-9999", 0, "1.5", "web"),  # unknown id: labelled but not captured
        ("", 0, "1.5", "web"),  # missing id
        ("req-0001", "x", "1.5", "web"),  # bad row index
        ("req-0002", 1, "cat", "web"),  # unparseable number
        ("req-0003", 1, "nan", "web"),  # not a finite number
    ]
    write_labels(tmp_path / "labels.csv", rows)
    return predicted, labelled


def errors_of(predicted: dict, labelled: dict, version: int) -> np.ndarray:
    return np.array([predicted[(version, *key)] - value for key, value in labelled.items()])


@pytest.mark.unit
def test_per_version_mse_and_mae_equal_numpy_on_the_recorded_answers(tmp_path, regression, capsys):
    predicted, labelled = regression
    flags = ("--labels", str(tmp_path / "labels.csv"), "--window", "1d", "--slice", "channel")
    code, report, err = live_eval(tmp_path, *flags, capsys=capsys)
    assert code == 0, err
    validate_report(report)
    assert report["labels"]["bad_rows"] == {
        "missing id": 1,
        "bad row index": 1,
        "unparseable label": 2,
        "unknown class": 0,
    }
    assert "2 labels-file row(s) skipped: unparseable label" in err and "Traceback" not in err
    assert report["labels"]["duplicate_rows"] == 3 and report["labels"]["conflicting_examples"] == 1
    assert report["join"]["labelled_not_captured"] == 1
    page = (tmp_path / "out" / "live.html").read_text()
    assert "mse over time" in page and 'id="live-v2"' in page and "no label-free estimate" in page
    for section in report["versions"]:
        error = errors_of(predicted, labelled, section["version"])
        cell = section["overall"]
        assert section["joined"] == len(labelled) and cell["accuracy"] is None
        assert cell["mse"] == pytest.approx(np.mean(error**2), rel=1e-9)
        assert cell["mae"] == pytest.approx(np.mean(np.abs(error)), rel=1e-9)
        assert cell["rmse"] == pytest.approx(np.sqrt(np.mean(error**2)), rel=1e-9)
        assert cell["mse_interval"] == pytest.approx(hall_one(error**2), rel=1e-7)
        assert cell["mae_interval"] == pytest.approx(hall_one(np.abs(error)), rel=1e-7)
        assert section["duplicates"] == 15 * ROWS  # every retry's answer (one off), labelled or not, not scored
        assert section["unlabelled"] == REQUESTS * ROWS - len(labelled)
        assert sum(w["examples"] for w in section["windows"]) == len(labelled)
        assert sum(w["errors"]["squared_error"]["sum"] for w in section["windows"]) == pytest.approx(np.sum(error**2))
        web = [k for k in labelled if k[1] == 0]
        (web_cell,) = [c for c in section["slices"]["channel"] if c["value"] == "web"]
        web_error = np.array([predicted[(section["version"], *k)] - labelled[k] for k in web])
        assert web_cell["mse"] == pytest.approx(np.mean(web_error**2), rel=1e-9)
        assert section["calibration"] is None and "regression" in section["estimate_note"]


@pytest.mark.unit
def test_max_drop_mse_is_paired_on_shadowed_requests_against_the_mean_difference(tmp_path, regression, capsys):
    predicted, labelled = regression
    paired = errors_of(predicted, labelled, 2) ** 2 - errors_of(predicted, labelled, 1) ** 2
    low, high = hall_one(paired)
    labels = str(tmp_path / "labels.csv")
    assert low > 0  # version 2 is worse: a margin above the interval passes, one below its lower end fails
    for margin, expected in ((high + 0.05, 0), (low / 2, 1)):
        code, report, _ = live_eval(tmp_path, "--labels", labels, "--max-drop", f"mse={margin}", capsys=capsys)
        (gate,) = report["gates"]
        assert gate["paired"] and gate["metric"] == "mse" and gate["version"] == 2
        assert gate["value"] == pytest.approx(paired.mean(), rel=1e-9)
        assert gate["interval"] == pytest.approx([low, high], rel=1e-9)
        assert code == expected, gate["said"]


@pytest.mark.unit
def test_max_drop_mae_is_unpaired_where_versions_split_the_traffic_with_a_skew_corrected_welch_interval(
    tmp_path, capsys
):
    predicted, truth = write_regression_traffic(tmp_path, shadow=False, worse=2.0, seed=3)
    write_labels(tmp_path / "labels.csv", [(rid, row, repr(v), "web") for (rid, row), v in truth.items()])
    code, report, _ = live_eval(
        tmp_path, "--labels", str(tmp_path / "labels.csv"), "--max-drop", "mae=5%", capsys=capsys
    )
    (gate,) = report["gates"]
    assert not gate["paired"] and "Welch" in gate["method"]
    mine, theirs = (
        np.array([abs(p - truth[(rid, row)]) for (v, rid, row), p in predicted.items() if v == version])
        for version in (2, 1)
    )
    assert gate["interval"] == pytest.approx(hall_two(mine, theirs), rel=1e-6)
    assert gate["margin"] == pytest.approx(0.05 * theirs.mean(), rel=1e-9)
    # Version 2's errors are three times as spread: shown worse by far more than 5 %.
    assert gate["verdict"] == "inferior" and code == 1
    assert report["pairs"][0]["examples"] < MIN_PAIRED


@pytest.mark.integration
def test_shards_merge_into_the_regression_report_one_client_writes(tmp_path, regression, capsys):
    flags = ["--labels", str(tmp_path / "labels.csv"), "--window", "1h", "--max-drop", "mse=0.5"]
    code, whole, _ = live_eval(tmp_path, *flags, capsys=capsys)
    shards = []
    for i in range(2):
        out = str(tmp_path / f"s{i}.json")
        common = ["live-eval", str(tmp_path / "cap"), "--model", "m", "--data-dir", str(tmp_path), *flags]
        assert main([*common, "--shard", f"{i}/2", "--report", out]) == code
        shards.append(out)
    assert main(["live-eval-merge", *shards, "--output", str(tmp_path / "merged.json")]) == code
    merged = json.loads((tmp_path / "merged.json").read_text())
    validate_report(merged)
    assert merged["join"] == whole["join"] and merged["labels"] == {**whole["labels"], "path": merged["labels"]["path"]}
    for ours, theirs in zip(merged["versions"], whole["versions"]):
        for key in ("mse", "mae", "mse_interval", "mae_interval"):
            assert ours["overall"][key] == pytest.approx(theirs["overall"][key], rel=1e-9)
        assert [w["examples"] for w in ours["windows"]] == [w["examples"] for w in theirs["windows"]]
    assert merged["gates"][0]["interval"] == pytest.approx(whole["gates"][0]["interval"], rel=1e-9)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (("--min-accuracy", "0.9"), "--min-accuracy: a regression model has no accuracy"),
        (("--max-drop", "0.02"), "--max-drop 0.02: a regression model: expected mse=X or mae=X"),
        (("--model-base-path", "."), "a regression model has none"),
    ],
)
def test_flags_that_mean_nothing_for_regression_are_refused_in_one_line(tmp_path, capsys, flags, said):
    write_regression_traffic(tmp_path)
    write_labels(tmp_path / "labels.csv", [("req-0000", 0, "1.5", "web")])
    code, report, err = live_eval(tmp_path, "--labels", str(tmp_path / "labels.csv"), *flags, capsys=capsys)
    errors = [line for line in err.splitlines() if "error:" in line]
    assert code == 2 and report is None and len(errors) == 1 and said in errors[0], err


@pytest.mark.unit
def test_a_regression_model_of_two_targets_is_refused_in_one_line(tmp_path, capsys):
    write_regression_traffic(tmp_path)
    record = {"task": {"kind": "regression", "classes": 0, "targets": 2}, "test_split": {}}
    (tmp_path / "m" / "versions" / "1.json").write_text(json.dumps(record))
    write_labels(tmp_path / "labels.csv", [("req-0000", 0, "1.5", "web")])
    code, report, err = live_eval(tmp_path, "--labels", str(tmp_path / "labels.csv"), capsys=capsys)
    errors = [line for line in err.splitlines() if "error:" in line]
    assert code == 2 and report is None and len(errors) == 1 and "predicts 2 targets" in errors[0], err
