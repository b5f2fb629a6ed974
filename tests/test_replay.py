"""`trainserve replay` on a real serve-local serving three versions side by side: stable (v1), a candidate that
sends one class elsewhere (v2: every example stable calls class 2 it calls class 3) and an identical copy of
stable (v3). The captured requests are PredictionLog records written here as capture writes them."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats
from scorers import save_scorer, traffic

from captures import capture_name, prediction_log, write_batches, write_capture
from serving_fixtures import serve_every_version
from trainserve.cli import main
from trainserve.replay.report import validate_report

# The unit tests here: serve-local on a thread of this process, real gRPC.


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from conftest import install_version

    root = tmp_path_factory.mktemp("replay")
    for version, moves in ((1, False), (2, True), (3, False)):
        install_version(save_scorer(root / f"scorer-{version}", moves), root / "scorer", version)
    server = serve_every_version(
        root / "models.config",
        "scorer",
        root / "scorer",
        (1, 2, 3),
        {"stable": 1, "candidate": 2, "same": 3},
        "--allow_version_labels_for_unavailable_models",
    )
    sent = traffic()
    write_batches(root / "capture", "scorer", sent, per_file=50)
    yield server, root / "capture", sent
    assert server.stop() == 0


def replay_cli(server, tmp_path, *args) -> tuple[int, dict | None]:
    report = tmp_path / "replay.json"
    code = main(["replay", *map(str, args), "--server", server.target, "--model", "scorer", "--report", str(report)])
    return code, json.loads(report.read_text()) if report.is_file() else None


def expected_flips(sent) -> tuple[int, int]:
    x = np.concatenate([b["x"] for b in sent])
    return int(np.sum(x.argmax(axis=1) == 2)), len(x)


@pytest.mark.integration
def test_a_candidate_that_moves_one_class_is_named_and_fails_the_gate(served, tmp_path, capsys):
    server, capture, sent = served
    code, report = replay_cli(server, tmp_path, capture, "--label", "candidate", "--max-flip-rate", "0.02")
    validate_report(report)
    flips, n = expected_flips(sent)
    f = report["flips"]
    assert (f["count"], f["examples"], f["rate"]) == (flips, n, pytest.approx(flips / n))
    assert f["top"] == [{"from": "2", "to": "3", "count": flips}]
    assert [(c["class"], c["flips_out"], c["flips_in"], c["out_rate"]) for c in f["per_class"]] == [
        ("2", flips, 0, 1.0),
        ("3", 0, flips, 0.0),
    ]
    bound = stats.binomtest(flips, n).proportion_ci(confidence_level=0.90, method="wilson").high
    assert f["upper_bound"] == pytest.approx(bound, rel=1e-9)
    assert code == 1 and report["passed"] is False
    assert [(g["kind"], g["passed"]) for g in report["gates"]] == [("max_error_rate", True), ("max_flip_rate", False)]
    assert "gate failed: flip rate" in capsys.readouterr().err
    assert (report["candidate"], report["baseline"]) == (
        {"reference": "candidate", "version": 2},
        {"reference": "stable", "version": 1},
    )
    assert report["requests"] == {"replayed": len(sent), "paired": len(sent), "examples": n}
    assert report["errors"] == {"candidate": {}, "baseline": {}}
    assert (report["error_share"]["candidate"], report["error_share"]["baseline"]) == (0.0, 0.0)
    # The probability moved is the class-2 probability of those examples: the shift's maximum, independently.
    x = np.concatenate([b["x"] for b in sent]).astype(np.float64)
    p = np.exp(3 * x) / np.exp(3 * x).sum(axis=1, keepdims=True)
    assert report["probability_shift"]["max"] == pytest.approx(p[p.argmax(axis=1) == 2, 2].max(), abs=1e-6)
    assert all(
        report["latency_ms"][s]["p50"] > 0 and report["latency_ms"][s]["requests"] == len(sent)
        for s in ("candidate", "baseline")
    )
    page = (tmp_path / "replay.html").read_text()
    assert 'id="flip-matrix"' in page and "FAILED" in page and 'src="data:image/png;base64,' in page


@pytest.mark.integration
def test_an_identical_candidate_flips_nothing_and_passes(served, tmp_path):
    server, capture, sent = served
    code, report = replay_cli(server, tmp_path, capture, "--label", "same", "--max-flip-rate", "0.02")
    _, n = expected_flips(sent)
    assert code == 0 and report["passed"] is True
    assert (report["flips"]["count"], report["flips"]["top"], report["probability_shift"]["max"]) == (0, [], 0.0)
    bound = stats.binomtest(0, n).proportion_ci(confidence_level=0.90, method="wilson").high
    assert report["flips"]["upper_bound"] == pytest.approx(bound, rel=1e-9) and 0 < bound < 0.02


@pytest.mark.integration
def test_shards_merge_into_the_one_client_report(served, tmp_path):
    server, capture, sent = served
    _, whole = replay_cli(server, tmp_path / "whole", capture, "--label", "candidate")
    paths = []
    for i in range(3):
        code, _ = replay_cli(server, tmp_path / f"s{i}", capture, "--label", "candidate", "--shard", f"{i}/3")
        assert code == 0
        paths.append(tmp_path / f"s{i}" / "replay.json")
    assert main(["replay-merge", *map(str, paths), "--output", str(tmp_path / "merged.json")]) == 0
    merged = json.loads((tmp_path / "merged.json").read_text())
    validate_report(merged)
    assert merged["flips"] == whole["flips"] and merged["requests"] == whole["requests"]
    assert merged["tally"]["flip_matrix"] == whole["tally"]["flip_matrix"]
    assert merged["probability_shift"]["histogram"] == whole["probability_shift"]["histogram"]
    assert merged["merged"]["shards"] == 3
    # More shards than records: a shard with none reports nothing replayed, and still merges.
    code, empty = replay_cli(server, tmp_path / "empty", capture, "--label", "candidate", "--shard", "299/300")
    assert code == 0 and empty["requests"] == {"replayed": 0, "paired": 0, "examples": 0}
    # A shard missing is refused in one line.
    assert main(["replay-merge", *map(str, paths[:2]), "--output", str(tmp_path / "m2.json")]) == 2


@pytest.mark.unit
@pytest.mark.parametrize(
    "case, fragments",
    [
        ("empty", ["holds no capture files"]),
        ("other-model", ["no records of model 'scorer', only of 'iris' (1)"]),
        ("same-version", ["are both version 1: expected two versions"]),
        ("unknown-label", ["'nope'"]),
    ],
)
def test_bad_input_is_one_line(served, tmp_path, capsys, case, fragments):
    server, capture, _ = served
    args = [capture, "--label", "candidate"]
    if case == "empty":
        args[0] = tmp_path
    elif case == "other-model":
        write_capture(tmp_path / capture_name(0), [prediction_log("iris", {"x": np.zeros((1, 4), np.float32)})])
        args[0] = tmp_path
    elif case == "same-version":
        args[1:] = ["--label", "stable"]
    else:
        args[1:] = ["--label", "nope", "--wait", "0"]
    code, _ = replay_cli(server, tmp_path, *args)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert all(f in err for f in fragments), err


@pytest.mark.integration
def test_regression_outputs_report_their_differences(served, tmp_path):
    """The probabilities read as regression targets: the moved mass is +p2 on class 3 and -p2 on class 2."""
    server, capture, sent = served
    code, report = replay_cli(
        server, tmp_path, capture, "--label", "candidate", "--task", "regression", "--output", "probabilities"
    )
    validate_report(report)
    x = np.concatenate([b["x"] for b in sent]).astype(np.float64)
    p = np.exp(3 * x) / np.exp(3 * x).sum(axis=1, keepdims=True)
    moved = p[p.argmax(axis=1) == 2, 2]
    d = report["regression_difference"]
    assert code == 0 and report["flips"] is None and d["count"] == 4 * len(x)
    # No flip-rate gate judged it: no verdict, however clean its errors (a report without a gate never passes).
    assert report["passed"] is None and [g["kind"] for g in report["gates"]] == ["max_error_rate"]
    assert (d["min"], d["max"], d["mean"]) == pytest.approx((-moved.max(), moved.max(), 0.0), abs=1e-6)
    # |d| per example and target, independently; the report's percentile is its histogram bin's upper edge.
    absolute = np.zeros((len(x), 4))
    absolute[p.argmax(axis=1) == 2, 2:] = moved[:, None]
    exact = np.quantile(absolute, 0.99, method="inverted_cdf")
    assert exact * (1 - 1e-6) <= d["abs_p99"] <= min(exact * 1.02 + 1e-6, max(-d["min"], d["max"]))


@pytest.mark.integration
def test_requests_the_versions_refuse_are_counted_as_errors_not_compared(served, tmp_path):
    """A client's malformed request (an input the signature lacks, a wrong shape) was refused in production too:
    both sides' INVALID_ARGUMENT counted, the pair left out of the flips, and no error of either version's own."""
    server, capture, sent = served
    mixed = tmp_path / "mixed"
    good = sent[:20]
    write_batches(mixed, "scorer", [*good, {"y": np.zeros((2, 4), np.float32)}, {"x": np.zeros((2, 5), np.float32)}])
    code, report = replay_cli(server, tmp_path, mixed, "--label", "candidate")
    assert code == 0 and report["errors"] == {"candidate": {"INVALID_ARGUMENT": 2}, "baseline": {"INVALID_ARGUMENT": 2}}
    assert report["requests"] == {"replayed": 22, "paired": 20, "examples": sum(len(b["x"]) for b in good)}
    assert report["flips"]["count"] == expected_flips(good)[0]
    share = report["error_share"]
    assert (share["candidate"], share["baseline"], share["refused_by_both"]) == (0.0, 0.0, 2)
    assert report["passed"] is None and report["gates"][0]["passed"] is True
