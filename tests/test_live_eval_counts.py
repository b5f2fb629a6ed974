"""One count per example in `trainserve live-eval`: every answer is a duplicate (an example its version had answered
before, labelled or not), scored, or unlabelled, and those add up to the answers in the version's row, every
window's and every slice's, against a count made here from the records the test wrote; the label-free estimate
counts each example once. Labels as people save them: a byte-order mark, Windows line endings, a header whose
names the error shows as repr writes them."""

from __future__ import annotations

import csv
import io
import json
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from captures import capture_name, prediction_log, write_capture
from trainserve.cli import main
from trainserve.live import join as join_module
from trainserve.live.calibration import fit_calibration, read_answers
from trainserve.live.labels import read_labels

pytestmark = pytest.mark.unit
CLASSES, ROWS, HOUR = 3, 3, 3600
T0 = 1_790_000_000 // HOUR * HOUR
REGIONS = ("eu", "us", "eu")  # the request input sliced on, by row


def traffic(directory: Path, requests: int = 30) -> list[tuple[int, str, int, np.ndarray]]:
    """Version 1 answers every request, version 2 the even ones (shadowed); every third request is retried by its
    version an hour later (another window). Returns the answers in capture order: (version, id, time, scores)."""
    rng = np.random.default_rng(0)
    answers = []
    for i in range(requests):
        for version in (1, 2) if i % 2 == 0 else (1,):
            scores = rng.dirichlet(np.full(CLASSES, 0.5), size=ROWS).astype(np.float32)
            for retry in range(2 if i % 3 == 0 else 1):
                answers.append((version, f"req-{i:03d}", T0 + i * 1200 + retry * HOUR, scores))
    records = [
        prediction_log(
            "m",
            {"x": np.full((ROWS, 1), 0, np.float32), "region": np.array(REGIONS)},
            version=version,
            request_id=rid,
            timestamp_s=when,
            outputs={"probabilities": scores},
        )
        for version, rid, when, scores in answers
    ]
    write_capture(directory / capture_name(0), records)
    return answers


def spreadsheet_labels(path: Path, requests: int = 30) -> dict[tuple[str, int], tuple[int, str]]:
    """Labels for most examples, saved as Excel's "CSV UTF-8" on Windows (a byte-order mark, CRLF), with repeated
    rows (agreeing) and one example labelled twice differently. Returns the labels kept: example -> (class, channel)."""
    rng = np.random.default_rng(1)
    rows, kept = [], {}
    for i in range(requests):
        for row in range(ROWS):
            if (i + row) % 4:
                label, channel = int(rng.integers(CLASSES)), ("web", "app")[row % 2]
                kept[(f"req-{i:03d}", row)] = (label, channel)
                rows.append([f"req-{i:03d}", row, label, channel])
    rows += [rows[2], rows[5]]  # the same label twice: counted once
    conflicted = rows[7]
    rows.append([*conflicted[:2], (conflicted[2] + 1) % CLASSES, conflicted[3]])  # which is true? not scored
    del kept[tuple(conflicted[:2])]
    with open(path, "w", newline="", encoding="utf-8-sig") as out:
        writer = csv.writer(out, lineterminator="\r\n")
        writer.writerow(["request_id", "request_row", "label", "channel"])
        writer.writerows(rows)
    assert path.read_bytes().startswith(b"\xef\xbb\xbfrequest_id,") and b"\r\n" in path.read_bytes()
    return kept


def independent_count(answers, kept) -> dict:
    """Per (version, level): Counter of answers by kind, counted example by example in capture order."""
    counts: dict = defaultdict(Counter)
    seen: set = set()
    for version, rid, when, _ in answers:
        for row in range(ROWS):
            key = (version, rid, row)
            kind = "duplicates" if key in seen else "examples" if (rid, row) in kept else "unlabelled"
            seen.add(key)
            levels = [("overall",), ("window", when // HOUR * HOUR), ("region", REGIONS[row])]
            if (rid, row) in kept:
                levels.append(("channel", kept[(rid, row)][1]))
            for level in levels:
                counts[(version, *level)][kind] += 1
                counts[(version, *level)]["captured"] += 1
    return counts


def cells_of(section: dict) -> dict:
    cells = {("overall",): section["overall"]}
    cells |= {("window", w["start"]): w for w in section["windows"]}
    cells |= {(column, c["value"]): c for column, rows in section["slices"].items() for c in rows}
    return cells


def test_every_answer_is_counted_once_at_every_level(tmp_path, capsys, monkeypatch):
    answers = traffic(tmp_path / "cap")
    kept = spreadsheet_labels(tmp_path / "labels.csv")
    held_out = np.random.default_rng(2).dirichlet(np.full(CLASSES, 0.5), size=400)
    truth = np.random.default_rng(3).integers(CLASSES, size=400)
    calibration = fit_calibration(1, held_out, truth, 1.0)
    monkeypatch.setattr(join_module, "calibrate_version", lambda *args: calibration)
    flags = ["--labels", str(tmp_path / "labels.csv"), "--window", "1h", "--slice", "region", "--slice", "channel"]
    report_path = tmp_path / "live.json"
    code = main(
        ["live-eval", str(tmp_path / "cap"), "--model", "m", "--data-dir", str(tmp_path), *flags]
        + ["--model-base-path", str(tmp_path), "--report", str(report_path)]
    )
    out = capsys.readouterr().out
    assert code == 0
    report = json.loads(report_path.read_text())
    # two repeated rows, and the conflicting row beyond its example's first: the file's rows add up
    assert report["labels"]["duplicate_rows"] == 3 and report["labels"]["conflicting_examples"] == 1
    expected = independent_count(answers, kept)
    for section in report["versions"]:
        v = section["version"]
        cells = cells_of(section)
        assert {(v, *level) for level in cells} == {key for key in expected if key[0] == v}
        for level, cell in cells.items():
            want = expected[(v, *level)]
            said = {kind: cell[kind] for kind in ("captured", "duplicates", "examples", "unlabelled")}
            assert said == {kind: want[kind] for kind in said}, (v, level)
            assert cell["examples"] + cell["unlabelled"] + cell["duplicates"] == cell["captured"]
        assert [section[k] for k in ("joined", "unlabelled", "duplicates")] == [
            section["overall"][k] for k in ("examples", "unlabelled", "duplicates")
        ]
        # The estimate over every answer counts each example once: the first answers' calibrated accuracies.
        first = {}
        for version, rid, _, scores in answers:
            for row in range(ROWS):
                first.setdefault((version, rid, row), scores[row])
        confidence = read_answers(np.array([p for (ver, *_), p in first.items() if ver == v]))[1]
        mapped = np.asarray(calibration.accuracy)[calibration.bins_of(confidence)]
        assert sum(section["overall"]["bins_all"]) == len(confidence)
        assert section["overall"]["estimate"]["value"] == pytest.approx(mapped.mean())
    totals = {k: sum(s[k] for s in report["versions"]) for k in ("joined", "unlabelled", "duplicates")}
    assert {k: report["join"][k] for k in totals} == totals
    # The table's rows add up too: labelled + unlabelled + duplicates of the windows equal the version's.
    rows = [line.split() for line in out.splitlines() if line.startswith("  ") and "labelled" not in line]
    versions = [i for i, r in enumerate(rows) if r[0].startswith("v")] + [len(rows)]
    for start, end in zip(versions, versions[1:]):
        windows = np.array([[int(x) for x in r[2:5]] for r in rows[start + 1 : end]])
        assert windows.sum(axis=0).tolist() == [int(x) for x in rows[start][1:4]]


def write_variant(path: Path, table: list[list], order: list[int], bom: bool, ending: str, quote: int, pad: str):
    """`table` (a header and rows) with its columns in `order`, the header's names padded with `pad`."""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator=ending, quoting=quote)
    header = [f"{pad}{table[0][i]}{pad}" for i in order]
    writer.writerow(header)
    writer.writerows([[row[i] for i in order] for row in table[1:]])
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.getvalue().encode())


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b", "c d", "é"]), st.integers(0, 2), st.integers(0, CLASSES - 1)),
        min_size=1,
        max_size=20,
    ),
    st.permutations(range(4)),
    st.booleans(),
    st.sampled_from(["\n", "\r\n", "\r"]),
    st.sampled_from([csv.QUOTE_MINIMAL, csv.QUOTE_ALL]),
    st.sampled_from(["", " "]),
)
def test_labels_read_alike_whatever_the_mark_line_ending_quoting_and_column_order(
    tmp_path_factory, rows, order, bom, ending, quote, pad
):
    table = [["request_id", "request_row", "label", "channel"], *([*r, "web"] for r in rows)]
    directory = tmp_path_factory.mktemp("labels")
    write_variant(directory / "plain.csv", table, [0, 1, 2, 3], False, "\n", csv.QUOTE_MINIMAL, "")
    write_variant(directory / "saved.csv", table, list(order), bom, ending, quote, pad)
    plain, saved = (
        read_labels(directory / name, "request_id", "request_row", "label", {}, CLASSES, ("channel",))
        for name in ("plain.csv", "saved.csv")
    )
    assert saved.keys.tolist() == plain.keys.tolist() and saved.labels.tolist() == plain.labels.tolist()
    assert saved.counts() == plain.counts() and sum(saved.bad.values()) == 0
    assert saved.slice_codes["channel"].tolist() == plain.slice_codes["channel"].tolist()


@pytest.mark.parametrize(
    "header, said",
    [
        ("request_id\u200b,label", r"its header has: 'request_id\u200b', 'label'"),
        ("request\xa0id,label", r"its header has: 'request\xa0id', 'label'"),
        ("id,label", "its header has: 'id', 'label'"),
    ],
    ids=["zero-width-space", "non-breaking-space", "other-name"],
)
def test_a_header_without_the_key_is_named_with_what_does_not_show(tmp_path, capsys, header, said):
    traffic(tmp_path / "cap", requests=2)
    (tmp_path / "labels.csv").write_text(f"{header}\r\nreq-000,0\r\n", encoding="utf-8-sig")
    code = main(["live-eval", str(tmp_path / "cap"), "--model", "m", "--labels", str(tmp_path / "labels.csv")])
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert code == 2 and len(errors) == 1 and f"no column 'request_id' (--key); {said}" in errors[0], errors
