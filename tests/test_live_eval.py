"""`trainserve live-eval` on captures written as capture writes them: the join's counts and per-version accuracy
against a count made here from the answers and labels the test wrote, the labels file's bad rows, windows, slices,
shards, the gates and their intervals (against published values), and the estimate's stated error (a seeded
simulation). Real model answers through serve-local: test_live_eval_serve_local.py."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from captures import capture_name, prediction_log, write_capture
from trainserve.cli import main
from trainserve.live.calibration import estimate, fit_calibration
from trainserve.live.gates import MIN_PAIRED
from trainserve.live.labels import example_key, read_labels
from trainserve.live.report import validate_report
from trainserve.shards import Shard
from trainserve.stats.proportions import newcombe_interval, wilson_interval

CLASSES = 3
T0 = 1_790_000_000  # a whole day in UTC seconds (T0 % 86400 == 0 is not needed: windows are floors)


def answers(rng, n: int) -> np.ndarray:
    return rng.dirichlet(np.ones(CLASSES), size=n).astype(np.float32)


def write_traffic(directory: Path, versions=(1, 2), requests=60, rows=2, shadow=True, seed=0) -> dict:
    """`requests` batched requests of `rows` examples, each answered by every version (shadowed) or by one
        (alternating); every 4th answered twice by its version (a retry). Returns {(version, id, row): the probabilities
    of the first answer}."""
    rng = np.random.default_rng(seed)
    records, predicted = [], {}
    for i in range(requests):
        request_id = f"req-{i:04d}"
        for version in versions if shadow else (versions[i % len(versions)],):
            p = answers(rng, rows)
            times = 2 if i % 4 == 0 else 1
            for repeat in range(times):
                records.append(
                    prediction_log(
                        "m",
                        {"x": np.full((rows, 1), i, np.float32), "region": np.array([["eu", "us"][i % 2]] * rows)},
                        version=version,
                        request_id=request_id,
                        timestamp_s=T0 + i * 1800,
                        outputs={"probabilities": p},
                    )
                )
                if repeat == 0:  # the first answer is the one scored
                    for row in range(rows):
                        predicted[(version, request_id, row)] = p[row]
    write_capture(directory / capture_name(0), records[: len(records) // 2])
    write_capture(directory / capture_name(1), records[len(records) // 2 :])
    return predicted


def write_labels(path: Path, rows: list[tuple], header="request_id,request_row,label,channel") -> Path:
    path.write_text(header + "\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))
    return path


def live_eval(tmp_path: Path, *flags: str, capsys=None) -> tuple[int, dict | None, str]:
    report = tmp_path / "out" / "live.json"
    code = main(
        [
            "live-eval",
            str(tmp_path / "cap"),
            "--model",
            "m",
            "--data-dir",
            str(tmp_path),
            *flags,
            "--report",
            str(report),
        ]
    )
    err = capsys.readouterr().err if capsys else ""
    return code, json.loads(report.read_text()) if report.is_file() else None, err


@pytest.fixture
def traffic(tmp_path):
    """Two versions answering 60 shadowed requests of 2 rows; labels for a known subset with every mismatch."""
    predicted = write_traffic(tmp_path / "cap")
    rng = np.random.default_rng(1)
    truth = {}
    rows = []
    for i in range(0, 60, 1):
        for row in range(2):
            if (i + row) % 5 == 0:
                continue  # unlabelled (the label never came)
            label = int(rng.integers(CLASSES))
            truth[(f"req-{i:04d}", row)] = label
            rows.append((f"req-{i:04d}", row, label, ["web", "app"][row]))
    rows += [rows[3], rows[7]]  # duplicated rows (agreeing): counted once
    conflicted = rows[10][:2]
    rows.append((*conflicted, (rows[10][2] + 1) % CLASSES, "web"))  # a conflicting label: not scored at all
    del truth[conflicted]
    rows += [
        ("req-9999", 0, 1, "web"),  # an id no request had: labelled but not captured
        ("", 0, 1, "web"),  # missing id
        ("req-0001", "x", 1, "web"),  # bad row index
        ("req-0002", 1, "cat", "web"),  # unparseable label
        ("req-0003", 1, 7, "web"),  # a class the model does not have
    ]
    write_labels(tmp_path / "labels.csv", rows)
    return predicted, truth


@pytest.mark.unit
def test_per_version_accuracy_equals_the_count_from_labels_and_recorded_answers(tmp_path, traffic, capsys):
    predicted, truth = traffic
    code, report, err = live_eval(tmp_path, "--labels", str(tmp_path / "labels.csv"), capsys=capsys)
    assert code == 0
    validate_report(report)
    for broken in ({"typo": 1}, {"correct": -1}):  # the schema holds every cell: no stray or impossible field
        bad = json.loads(json.dumps(report))
        bad["versions"][0]["windows"][0].update(broken)
        with pytest.raises(jsonschema.ValidationError):
            validate_report(bad)
    for section in report["versions"]:
        v = section["version"]
        right = sum(np.argmax(predicted[(v, rid, row)]) == label for (rid, row), label in truth.items())
        loss = np.mean([-np.log(max(predicted[(v, *k)][label], 1e-7)) for k, label in truth.items()])
        assert section["overall"]["loss"] == pytest.approx(loss, rel=1e-6)
        assert section["joined"] == len(truth)
        assert section["overall"]["correct"] == right
        assert section["overall"]["interval"] == pytest.approx(list(wilson_interval(right, len(truth))))
        assert section["captured"] == 60 * 2 + 15 * 2  # every answer, the 15 retried requests' second ones too
        assert section["duplicates"] == 15 * 2  # every retried answer, labelled or not
        assert section["unlabelled"] == 120 - len(truth)
        assert np.sum(section["confusion_matrix"]) == len(truth)
    assert report["labels"]["bad_rows"] == {
        "missing id": 1,
        "bad row index": 1,
        "unparseable label": 1,
        "unknown class": 1,
    }
    assert report["labels"]["duplicate_rows"] == 3 and report["labels"]["conflicting_examples"] == 1
    assert report["join"]["labelled_not_captured"] == 1
    lines = [line for line in err.splitlines() if line.startswith("trainserve live-eval:")]
    for said in (
        "1 labels-file row(s) skipped: missing id",
        "unparseable label",
        "unknown class",
        "bad row index",
        "3 labels-file row(s) repeat",
        "1 example(s) given different labels",
        "1 label(s) match no captured",
    ):
        assert sum(said in line for line in lines) == 1, (said, err)
    assert "Traceback" not in err


@pytest.mark.unit
def test_windows_and_slices_add_up_to_the_version(tmp_path, traffic, capsys):
    _, truth = traffic
    code, report, _ = live_eval(
        tmp_path,
        "--labels",
        str(tmp_path / "labels.csv"),
        "--window",
        "1h",
        "--slice",
        "channel",
        "--slice",
        "region",
        capsys=capsys,
    )
    assert code == 0
    section = report["versions"][0]
    assert len(section["windows"]) == 30  # a request every 30 minutes, for 30 hours
    assert all(w["end"] - w["start"] == 3600 for w in section["windows"])
    for field in ("captured", "examples", "correct"):
        assert sum(w[field] for w in section["windows"]) == section["overall"][field]
    channel = {c["value"]: c["examples"] for c in section["slices"]["channel"]}
    assert channel == {"web": sum(r == 0 for _, r in truth), "app": sum(r == 1 for _, r in truth)}
    region = {c["value"]: c for c in section["slices"]["region"]}
    assert sum(c["examples"] for c in region.values()) == len(truth)
    assert sum(c["captured"] for c in region.values()) == section["captured"]


@pytest.mark.integration
def test_shards_merge_into_the_report_one_client_writes(tmp_path, traffic, capsys):
    labels = str(tmp_path / "labels.csv")
    flags = ["--labels", labels, "--window", "1h", "--slice", "channel", "--max-drop", "0.2"]
    code, whole, _ = live_eval(tmp_path, *flags, capsys=capsys)
    shards = []
    for i in range(3):
        assert (
            main(
                [
                    "live-eval",
                    str(tmp_path / "cap"),
                    "--model",
                    "m",
                    "--data-dir",
                    str(tmp_path),
                    *flags,
                    "--shard",
                    f"{i}/3",
                    "--report",
                    str(tmp_path / f"s{i}.json"),
                ]
            )
            == code
        )
        shards.append(str(tmp_path / f"s{i}.json"))
    assert main(["live-eval-merge", *shards, "--output", str(tmp_path / "merged.json")]) == code
    merged = json.loads((tmp_path / "merged.json").read_text())
    validate_report(merged)
    for key in ("labels", "join", "pairs"):
        assert merged[key] == whole[key], key
    for ours, theirs in zip(merged["versions"], whole["versions"]):
        for key in ("joined", "unlabelled", "duplicates", "confusion_matrix"):
            assert ours[key] == theirs[key]
        assert [w["correct"] for w in ours["windows"]] == [w["correct"] for w in theirs["windows"]]
        assert ours["overall"]["loss"] == pytest.approx(theirs["overall"]["loss"])
    assert [g["passed"] for g in merged["gates"]] == [g["passed"] for g in whole["gates"]]
    assert main(["live-eval-merge", *shards[:2], "--output", str(tmp_path / "m2.json")]) == 2
    assert "expected every shard I/N of one live-eval run" in capsys.readouterr().err


@pytest.mark.unit
def test_max_drop_is_paired_on_shadowed_requests_and_unpaired_otherwise(tmp_path, capsys):
    labels = [(f"req-{i:04d}", row, 0, "web") for i in range(200) for row in range(2)]
    write_labels(tmp_path / "labels.csv", labels)
    write_traffic(tmp_path / "cap", requests=200, shadow=True)
    code, shadowed, _ = live_eval(
        tmp_path, "--labels", str(tmp_path / "labels.csv"), "--max-drop", "0.5", capsys=capsys
    )
    gate = shadowed["gates"][0]
    pair = shadowed["pairs"][0]
    assert gate["paired"] and pair["examples"] == 400 and code == 0
    assert gate["value"] == pytest.approx((pair["second_only"] - pair["first_only"]) / 400)  # v2 minus v1
    assert gate["verdict"] == "non-inferior"
    for path in (tmp_path / "cap").iterdir():
        path.unlink()
    write_traffic(tmp_path / "cap", requests=200, shadow=False)
    code, alone, _ = live_eval(tmp_path, "--labels", str(tmp_path / "labels.csv"), "--max-drop", "0.5", capsys=capsys)
    gate = alone["gates"][0]
    assert not gate["paired"] and alone["pairs"][0]["examples"] < MIN_PAIRED and "unpaired" in gate["said"]
    c, b = (next(s["overall"] for s in alone["versions"] if s["version"] == v) for v in (2, 1))
    assert gate["interval"] == pytest.approx(
        list(newcombe_interval(c["correct"], c["examples"], b["correct"], b["examples"]))
    )


@pytest.mark.unit
def test_min_accuracy_fails_with_exit_1_only_when_shown_below(tmp_path, capsys):
    # Labels that agree with no answer of version 2 at all: accuracy 0, shown below anything.
    predicted = write_traffic(tmp_path / "cap", requests=100)
    rows = [(rid, row, (np.argmax(p) + 1) % CLASSES, "web") for (v, rid, row), p in predicted.items() if v == 2]
    write_labels(tmp_path / "labels.csv", rows)
    code, report, err = live_eval(
        tmp_path, "--labels", str(tmp_path / "labels.csv"), "--min-accuracy", "0.5", capsys=capsys
    )
    assert code == 1 and report["gates"][0]["verdict"] == "below" and "gate failed" in err
    write_labels(tmp_path / "labels.csv", rows[:2])  # two labels: nothing is shown either way
    for setting, expected in (("pass", 0), ("fail", 1)):
        code, report, _ = live_eval(
            tmp_path,
            "--labels",
            str(tmp_path / "labels.csv"),
            "--min-accuracy",
            "0.5",
            "--inconclusive",
            setting,
            capsys=capsys,
        )
        assert (code, report["gates"][0]["verdict"]) == (expected, "inconclusive")


@pytest.mark.unit
def test_newcombe_interval_matches_newcombes_published_examples():
    # Newcombe (1998), Statistics in Medicine 17:873, Table II, method 10.
    assert newcombe_interval(56, 70, 48, 80) == pytest.approx((0.0524, 0.3339), abs=5e-5)
    assert newcombe_interval(9, 10, 3, 10) == pytest.approx((0.1705, 0.8090), abs=5e-5)


@pytest.mark.unit
@pytest.mark.parametrize(
    "content, said",
    [
        (b"id,label\nr1,0\n", "no column 'request_id' (--key); its header has: 'id', 'label'"),
        (b"request_id,class\nr1,0\n", "no column 'label' (--label-column)"),
        (b"request_id,label\n\xff\xfe,0\n", "UTF-8"),
    ],
    ids=["no-key-column", "no-label-column", "not-utf8"],
)
def test_a_labels_file_it_cannot_read_is_one_line(tmp_path, capsys, content, said):
    write_traffic(tmp_path / "cap", requests=4)
    (tmp_path / "labels.csv").write_bytes(content)
    code, report, err = live_eval(tmp_path, "--labels", str(tmp_path / "labels.csv"), capsys=capsys)
    errors = [line for line in err.splitlines() if "error:" in line]
    assert code == 2 and report is None and len(errors) == 1 and said in errors[0], err


@pytest.mark.integration
def test_the_estimates_stated_error_covers_the_realised_accuracy_as_often_as_it_says():
    """A model calibrated as its held-out split says: over seeded draws of held-out split and traffic, the
    realised accuracy of a 500-answer window falls within the estimate's 95 % error about 95 % of the time."""
    rng = np.random.default_rng(7)
    chance = np.linspace(0.35, 0.99, 40)  # each answer's true chance of being right, rising with its confidence

    def draw(n):
        k = rng.integers(len(chance), size=n)
        probabilities = np.full((n, 10), 0.0)
        probabilities[:, 0] = 0.3 + 0.69 * k / (len(chance) - 1)  # the top probability, monotone in the chance
        probabilities[:, 1:] = ((1 - probabilities[:, 0]) / 9)[:, None]
        return probabilities, np.where(rng.random(n) < chance[k], 0, 1)

    covered = 0
    draws = 300
    for _ in range(draws):
        calibration = fit_calibration(1, *draw(400), max_ece=1.0)
        probabilities, labels = draw(500)
        bins = calibration.bins_of(probabilities[:, 0])
        said = estimate(calibration, np.bincount(bins, minlength=len(calibration.counts)), 0.95, 0.25)
        covered += abs(np.mean(labels == 0) - said["value"]) <= said["error"]
    assert 0.92 <= covered / draws <= 0.99, covered / draws


@pytest.mark.unit
@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c", "d", "é", "x,y", ""]),
            st.integers(0, 2),
            st.sampled_from(["0", "1", "2", "9", "z", ""]),
        ),
        max_size=40,
    ),
    st.integers(1, 3),
)
def test_the_labels_table_keeps_each_example_once_as_a_dictionary_would(tmp_path_factory, rows, shards):
    """Whatever the rows and however sharded: the kept labels are the examples whose rows all agree, each once; bad
    rows, duplicate rows and conflicting examples counted as a plain dictionary counts them; the shards add up."""
    import csv

    path = tmp_path_factory.mktemp("labels") / "labels.csv"
    with open(path, "w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(["request_id", "request_row", "label"])
        writer.writerows(rows)
    seen: dict = {}
    bad = {"missing id": 0, "unparseable label": 0, "unknown class": 0}
    for rid, row, label in rows:
        if not rid:
            bad["missing id"] += 1
        elif label in ("z", ""):
            bad["unparseable label"] += 1
        elif int(label) >= CLASSES:
            bad["unknown class"] += 1
        else:
            seen.setdefault((rid, row), []).append(int(label))
    agreed = {k: v[0] for k, v in seen.items() if len(set(v)) == 1}
    tables = [
        read_labels(path, "request_id", "request_row", "label", {}, CLASSES, shard=Shard(i, shards))
        for i in range(shards)
    ]
    assert sum(len(t.keys) for t in tables) == len(agreed)
    assert sum(t.conflicting for t in tables) == len(seen) - len(agreed)
    assert sum(t.duplicates for t in tables) == sum(len(v) - 1 for v in seen.values())
    for kind, count in bad.items():
        assert sum(t.bad[kind] for t in tables) == count
    accounted = sum(len(t.keys) + sum(t.bad.values()) + t.duplicates + t.conflicting for t in tables)
    assert sum(t.rows for t in tables) == len(rows) == accounted  # every row of the file, once
    for (rid, row), label in agreed.items():
        found = [
            t.labels[i] for t in tables if (i := int(t.find(np.array([example_key(rid, row)], np.uint64))[0])) >= 0
        ]
        assert found == [label]


@pytest.mark.unit
def test_one_score_per_example_is_class_ones_probability(tmp_path, capsys):
    """A binary model answering one sigmoid score: class 1 when it is above one half, as eval reads it."""
    rng = np.random.default_rng(4)
    scores = rng.random((40, 1)).astype(np.float32)
    records = [
        prediction_log("m", {"x": np.zeros((1, 1), np.float32)}, request_id=f"b{i}", outputs={"probabilities": s[None]})
        for i, s in enumerate(scores)
    ]
    write_capture(tmp_path / "cap" / capture_name(0), records)
    truth = rng.integers(0, 2, 40)
    write_labels(tmp_path / "labels.csv", [(f"b{i}", 0, t, "web") for i, t in enumerate(truth)])
    code, report, _ = live_eval(tmp_path, "--labels", str(tmp_path / "labels.csv"), capsys=capsys)
    assert code == 0 and report["task"]["classes"] == 2
    assert report["versions"][0]["overall"]["correct"] == int(np.sum((scores[:, 0] > 0.5) == truth))


@pytest.mark.unit
def test_since_leaves_out_the_answers_given_before_it_and_counts_them(tmp_path, traffic, capsys):
    import datetime

    since = datetime.datetime.fromtimestamp(T0 + 15 * 3600, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    code, report, _ = live_eval(
        tmp_path, "--labels", str(tmp_path / "labels.csv"), "--window", "1h", "--since", since, capsys=capsys
    )
    # Requests 0..29 (one each 30 minutes) came before, each answered by both versions, 8 of them twice.
    assert code == 0 and report["join"]["records_before_since"] == (30 + 8) * 2
    assert report["join"]["since_s"] == T0 + 15 * 3600
    for section in report["versions"]:
        assert min(w["start"] for w in section["windows"]) == T0 + 15 * 3600 - (T0 + 15 * 3600) % 3600
        assert section["records"] == 30 + 7


@pytest.mark.unit
def test_max_drop_takes_eval_s_metric_form_for_accuracy_and_refuses_an_error_metric(tmp_path, traffic, capsys):
    labels = str(tmp_path / "labels.csv")
    _, bare, _ = live_eval(tmp_path, "--labels", labels, "--max-drop", "0.2", capsys=capsys)
    _, named, _ = live_eval(tmp_path, "--labels", labels, "--max-drop", "accuracy=0.2", capsys=capsys)
    assert named["gates"][0]["interval"] == bare["gates"][0]["interval"]
    assert named["gates"][0]["verdict"] == bare["gates"][0]["verdict"]
    code, _, err = live_eval(tmp_path, "--labels", labels, "--max-drop", "mse=0.1", capsys=capsys)
    assert code == 2 and "a classification model: expected an accuracy drop" in err
