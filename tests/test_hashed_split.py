"""The held-out split as a function of the row (trainserve.hashed_split): a row's side does not depend on the
other rows, their order, or --seed; its salt, fraction and key are what decide it. Checked against the
documented formula computed here with hashlib, independently of the module."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainserve.errors import TrainserveError
from trainserve.hashed_split import (
    HashedSplit,
    array_row_digests,
    csv_row_digests,
    default_salt,
    file_digests,
    split_by_digest,
)
from trainserve.sources import load_dataset
from trainserve.sources.csv_table import load_csv

pytestmark = pytest.mark.unit

HEADER = ["id", "x", "label"]


def documented_side(salt: str, fraction: float, header: list[str], row: list[str]) -> bool:
    """The module docstring's rule, written out: held out when the salted bucket is below fraction x 10,000."""
    named = sorted(zip(header, row))
    digest = hashlib.sha256(json.dumps([[n for n, _ in named], [v for _, v in named]]).encode()).digest()
    bucket = int.from_bytes(hashlib.sha256(salt.encode() + b"\x00" + digest).digest()[:8], "big") % 10_000
    return bucket < round(fraction * 10_000)


def csv_text(rows: list[list[str]], header=HEADER) -> str:
    return "\n".join(",".join(r) for r in [header, *rows]) + "\n"


rows_strategy = st.lists(
    st.tuples(st.integers(0, 10**6), st.sampled_from(["", "0.5", "-3", "abc", "x y"]), st.sampled_from("01")),
    min_size=1,
    max_size=60,
    unique_by=lambda r: r[0],
).map(lambda rows: [[str(i), x, y] for i, x, y in rows])


@settings(max_examples=60, deadline=None)
@given(
    rows=rows_strategy,
    keep=st.lists(st.booleans(), min_size=60, max_size=60),
    seed=st.integers(0, 2**31 - 1),
    salt=st.text(min_size=1, max_size=12),
    fraction=st.floats(0.05, 0.95),
)
def test_a_rows_side_is_its_own_whatever_rows_are_added_removed_or_reordered(rows, keep, seed, salt, fraction):
    split = HashedSplit(salt, fraction)
    whole = dict(zip(map(tuple, rows), split.held_out(csv_row_digests(HEADER, rows, None))))
    edited = [r for r, k in zip(rows, keep) if k] + [[f"new{i}", "1", "0"] for i in range(3)]
    edited = [edited[i] for i in np.random.default_rng(seed).permutation(len(edited))]
    again = split.held_out(csv_row_digests(HEADER, edited, None))
    for row, side in zip(edited, again):
        assert side == documented_side(salt, fraction, HEADER, row)
        if tuple(row) in whole:
            assert side == whole[tuple(row)]


def test_columns_in_another_order_or_a_key_column_keep_the_side():
    rows = [[str(i), f"{i * 0.25}", str(i % 2)] for i in range(200)]
    split = HashedSplit("s", 0.3)
    mine = split.held_out(csv_row_digests(HEADER, rows, None))
    swapped = split.held_out(csv_row_digests(["label", "x", "id"], [r[::-1] for r in rows], None))
    assert np.array_equal(mine, swapped) and 30 < mine.sum() < 90
    by_id = HashedSplit("s", 0.3, key="id")
    edited = [[r[0], "9", r[2]] for r in rows]  # every feature edited: the id alone decides
    assert np.array_equal(
        by_id.held_out(csv_row_digests(HEADER, rows, "id")), by_id.held_out(csv_row_digests(HEADER, edited, "id"))
    )
    expected = [hashlib.sha256(r[0].encode()).digest() for r in rows]
    assert csv_row_digests(HEADER, rows, "id").tolist() == expected


def test_a_csv_holds_out_the_same_rows_whatever_the_seed_and_rows_appended_keep_theirs(tmp_path):
    rows = [[str(i), str(i % 7), str(i % 2)] for i in range(300)]
    small, grown = tmp_path / "small.csv", tmp_path / "grown.csv"
    small.write_text(csv_text(rows))
    grown.write_text(csv_text(rows + [[str(i), str(i % 5), str(i % 2)] for i in range(300, 450)]))
    split = HashedSplit(default_salt("m"), 0.2)
    held = lambda path, seed: set(load_csv(path, "label", 0.2, seed, (), split).test["id"].tolist())  # noqa: E731
    assert held(small, 0) == held(small, 7)
    assert held(small, 0) == held(grown, 3) & set(range(300))
    expected = {i for i, r in enumerate(rows) if documented_side(split.salt, 0.2, HEADER, r)}
    assert held(small, 0) == expected
    ds = load_csv(grown, "label", 0.2, 0, (), split)
    assert ds.hashed_split["salt"] == "model:m" and ds.hashed_split["held_out_buckets"] == 2000
    assert set(ds.hashed_split["class_fractions"]) == {"0", "1"} and len(ds.test_digests) == len(ds.y_test)
    # the seed-drawn split of versions trained before (no scheme) is unchanged
    legacy = load_csv(small, "label", 0.2, 0)
    assert legacy.hashed_split is None and len(legacy.y_test) == 60


def test_digits_is_split_by_hash_and_eval_can_digest_the_same_rows():
    split = HashedSplit(default_salt("digits"), 0.2)
    a, b = load_dataset("digits", seed=0, split=split), load_dataset("digits", seed=5, split=split)
    assert np.array_equal(a.x_test, b.x_test) and 330 < len(a.y_test) < 390
    assert np.array_equal(array_row_digests(a.test, a.y_test), a.test_digests)
    other = load_dataset("digits", split=HashedSplit("another", 0.2))
    assert not np.array_equal(a.test_digests, other.test_digests)


def test_an_image_file_is_placed_by_its_bytes(tmp_path):
    files = []
    for i in range(3):
        files.append(tmp_path / f"f{i}.png")
        files[-1].write_bytes(bytes([i]) * 10)
    renamed = tmp_path / "renamed.png"
    renamed.write_bytes(files[1].read_bytes())
    digests = file_digests(files + [renamed])
    assert digests[1] == digests[3] == hashlib.sha256(bytes([1]) * 10).digest()


def test_digests_ending_in_zero_bytes_are_hashed_whole():
    """numpy's S32 items drop trailing zero bytes; the bucket must be the one of all 32 bytes."""
    digest = b"\x07" * 31 + b"\x00"
    split = HashedSplit("z", 0.5)
    bucket = int.from_bytes(hashlib.sha256(b"z\x00" + digest).digest()[:8], "big") % 10_000
    assert split.held_out(np.array([digest], "S32"))[0] == (bucket < 5000)


def test_a_split_that_leaves_a_side_empty_is_refused():
    with pytest.raises(TrainserveError, match="puts all 1 examples on one side"):
        split_by_digest(csv_row_digests(HEADER, [["1", "2", "0"]], None), HashedSplit("s", 0.2), "data file t.csv")


def test_a_larger_fraction_holds_out_rows_the_baseline_trained_on_counted_exactly(tmp_path):
    """The candidate held out 35 % (same salt), the baseline 20 %: the rows counted are those only the candidate
    held out, computed here from the documented rule."""
    from trainserve.evaluation.config import EvalConfig
    from trainserve.evaluation.data import open_eval_data
    from trainserve.evaluation.proof import baseline_evidence

    rows = [[str(i), str(i % 11), str(i % 2)] for i in range(400)]
    wider = [r for r in rows if documented_side("s", 0.35, HEADER, r)]
    only_wider = [r for r in wider if not documented_side("s", 0.2, HEADER, r)]
    (tmp_path / "held.csv").write_text(csv_text(wider))
    record = {"test_split": {"provenance": {"source": "t.csv", "split": HashedSplit("s", 0.2).to_json()}}}
    (tmp_path / "m" / "versions").mkdir(parents=True)
    (tmp_path / "m" / "versions" / "1.json").write_text(json.dumps(record))
    config = EvalConfig(model="m", data_dir=tmp_path, compare_with="stable", label_column="label")
    data = open_eval_data(str(tmp_path / "held.csv"), label_column="label")
    section = baseline_evidence(config, 1, {}, None, data)
    assert section["rows"] == "overlapping" and section["rows_checked"] == len(wider) > 100
    assert section["rows_overlapping"] == len(only_wider) > 0.3 * len(wider)
    narrow = [r for r in wider if documented_side("s", 0.2, HEADER, r)]
    (tmp_path / "narrow.csv").write_text(csv_text(narrow))
    section = baseline_evidence(config, 1, {}, None, open_eval_data(str(tmp_path / "narrow.csv"), label_column="label"))
    assert (section["rows"], section["rows_checked"], section["rows_overlapping"]) == ("disjoint", len(narrow), 0)


@pytest.mark.parametrize(
    ("theirs", "rows", "said"),
    [
        pytest.param(
            {"source": "t.csv", "source_sha256": "a", "seed": 0, "test_fraction": 0.2},
            "unknown",
            "retrain it once",
            id="trained-before-hashing-other-data",
        ),
        pytest.param(
            {"source": "t.csv", "source_sha256": "b", "seed": 0, "test_fraction": 0.2},
            "overlapping",
            "another draw of the same data",
            id="trained-before-hashing-same-file-other-seed",
        ),
    ],
)
def test_a_baseline_trained_before_hashed_splits_keeps_its_answer(tmp_path, theirs, rows, said):
    """Old records (no scheme) are read as before: the rows cannot be placed, only the provenance compared."""
    from trainserve.evaluation.config import EvalConfig
    from trainserve.evaluation.data import open_eval_data
    from trainserve.evaluation.proof import baseline_evidence

    (tmp_path / "held.csv").write_text(csv_text([["1", "2", "0"], ["2", "3", "1"]]))
    (tmp_path / "m" / "versions").mkdir(parents=True)
    (tmp_path / "m" / "versions" / "1.json").write_text(json.dumps({"test_split": {"provenance": theirs}}))
    mine = {"test_split": {"provenance": {"source": "t.csv", "source_sha256": "b", "seed": 4, "test_fraction": 0.2}}}
    config = EvalConfig(model="m", data_dir=tmp_path, compare_with="stable", label_column="label")
    section = baseline_evidence(config, 1, mine, None, open_eval_data(str(tmp_path / "held.csv"), label_column="label"))
    assert section["rows"] == rows and said in section["said"] and "rows_checked" not in section


def test_a_key_column_places_rows_and_bad_split_flags_are_one_line_errors(tmp_path):
    from trainserve.training.config import TrainConfig

    rows = [[str(i), str(i % 7), str(i % 2)] for i in range(200)]
    path = tmp_path / "t.csv"
    path.write_text(csv_text(rows))
    by_id = HashedSplit("s", 0.2, key="id")
    before = load_csv(path, "label", 0.2, 0, (), by_id)
    path.write_text(csv_text([[i, "99", y] for i, _, y in rows]))  # every feature edited
    after = load_csv(path, "label", 0.2, 0, (), by_id)
    assert np.array_equal(before.test["id"], after.test["id"]) and after.hashed_split["key"] == "id"
    with pytest.raises(TrainserveError, match="--split-key nope: data file .* has no such column: expected one of id"):
        load_csv(path, "label", 0.2, 0, (), HashedSplit("s", 0.2, key="nope"))
    with pytest.raises(TrainserveError, match="--split-key applies to a --data FILE.csv"):
        TrainConfig(split_key="id").check()
    assert TrainConfig(model_name="m").held_out_split == HashedSplit("model:m", 0.2)
    assert TrainConfig(split_salt="x", test_fraction=0.3).held_out_split == HashedSplit("x", 0.3)


def test_a_class_the_hash_holds_out_whole_is_refused_naming_it(tmp_path):
    rows = [["1", "2", "0"], ["2", "3", "1"], ["3", "4", "0"], ["4", "5", "1"], ["5", "5", "2"]]
    split = next(
        HashedSplit(f"s{i}", 0.3)
        for i in range(200)
        if list(HashedSplit(f"s{i}", 0.3).held_out(csv_row_digests(HEADER, rows, None))) == [False] * 4 + [True]
    )
    (tmp_path / "t.csv").write_text(csv_text(rows))
    with pytest.raises(TrainserveError, match="class '2' has all its 1 example.s. held out .*another --split-salt"):
        load_csv(tmp_path / "t.csv", "label", 0.3, 0, (), split)
