"""Reading captured traffic back: name order, model filter, shards, and damage (a killed writer's truncated
tail, a corrupt checksum) read up to or around, with one line each; nothing to read is one error line."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from captures import capture_name, prediction_log, write_batches, write_capture
from trainserve.errors import TrainserveError
from trainserve.shards import Shard
from trainserve.tensors import from_tensor_proto
from trainserve.tfrecord import frame
from trainserve.traffic.reader import ReadSummary, read_capture

pytestmark = pytest.mark.unit


def batches(count: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(size=(int(rng.integers(1, 4)), 3)).astype(np.float32)} for _ in range(count)]


def read_ids(paths, model="m", shard=None, summary=None) -> list[str]:
    return [r.request_id for r in read_capture(paths, model, shard, summary)]


def test_records_come_back_in_file_name_order_with_their_requests(tmp_path):
    sent = batches(10)
    ids = write_batches(tmp_path / "cap", "m", sent, per_file=3)
    # A second writer (another host) and another model in the same directory.
    write_capture(tmp_path / "cap" / capture_name(0, host="host-b"), [prediction_log("other", sent[0])])
    summary = ReadSummary()
    got = list(read_capture([tmp_path / "cap"], "m", summary=summary))
    assert [r.request_id for r in got] == ids
    for record, batch in zip(got, sent):
        np.testing.assert_array_equal(from_tensor_proto(record.request.inputs["x"]), batch["x"])
        assert (record.model, record.version, record.signature) == ("m", 1, "serving_default")
    assert (summary.files, summary.records, summary.kept, dict(summary.other_models)) == (5, 11, 10, {"other": 1})
    assert summary.damage == []


@pytest.mark.parametrize("count", [1, 3, 4], ids=lambda n: f"{n}-shards")
def test_shards_split_the_records_exactly_once(tmp_path, count):
    ids = write_batches(tmp_path, "m", batches(11), per_file=4)
    shards = [read_ids([tmp_path], shard=Shard(i, count)) for i in range(count)]
    assert sorted(sum(shards, [])) == ids
    assert all(s == ids[i::count] for i, s in enumerate(shards))


def test_nothing_to_read_is_one_line_each(tmp_path):
    with pytest.raises(TrainserveError, match="holds no capture files"):
        read_ids([tmp_path])
    with pytest.raises(TrainserveError, match="no such file or directory"):
        read_ids([tmp_path / "missing"])
    write_capture(tmp_path / capture_name(0), [])
    with pytest.raises(TrainserveError, match="1 capture file\\(s\\) but no readable Predict records"):
        read_ids([tmp_path])
    write_capture(tmp_path / capture_name(1), [prediction_log("iris", {"x": np.zeros((1, 3), np.float32)})] * 2)
    with pytest.raises(TrainserveError, match="no records of model 'm', only of 'iris' \\(2\\)") as err:
        read_ids([tmp_path])
    assert "\n" not in str(err.value)


def test_a_killed_writers_truncated_tail_keeps_every_record_before_it(tmp_path, caplog):
    ids = write_batches(tmp_path, "m", batches(4), per_file=4)
    path = tmp_path / capture_name(0)
    data = path.read_bytes()
    path.write_bytes(data[:-7])
    summary = ReadSummary()
    with caplog.at_level(logging.WARNING):
        assert read_ids([tmp_path], summary=summary) == ids[:3]
    last = len(prediction_log("m", batches(4)[3], request_id=ids[3], timestamp_s=1_790_000_003)) + 16
    assert summary.skipped_bytes == last - 7
    assert [line for line in caplog.messages] == summary.damage and len(summary.damage) == 1
    assert summary.after_start.said() is None  # the damaged tail is no record written while it was read
    assert "the last record is truncated" in summary.damage[0] and f"last {last - 7} bytes skipped" in summary.damage[0]


def test_a_corrupt_checksum_skips_that_record_only(tmp_path):
    sent = batches(5)
    ids = write_batches(tmp_path, "m", sent, per_file=5)
    path = tmp_path / capture_name(0)
    data = bytearray(path.read_bytes())
    first = len(prediction_log("m", sent[0], request_id=ids[0], timestamp_s=1_790_000_000)) + 16
    data[first + 12 + 5] ^= 0xFF  # inside the second record's data
    path.write_bytes(bytes(data))
    summary = ReadSummary()
    assert read_ids([tmp_path], summary=summary) == [ids[0], *ids[2:]]
    assert summary.skipped == 1 and "data checksum does not match" in summary.damage[0]
    assert f"record at byte {first} skipped" in summary.damage[0]


RECORDS = st.lists(st.binary(min_size=0, max_size=40), min_size=1, max_size=6)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(RECORDS, st.data())
def test_any_truncation_or_flipped_byte_reads_what_is_intact(tmp_path_factory, payloads, data):
    """Each record is a PredictionLog whose request id is its index (padding varies its size). Truncated at any
    byte: exactly the records wholly before it. One byte flipped: in a record's length or its checksum the file
    ends there; in its data or data checksum that record alone is skipped. Never an exception but the one line."""
    records = [
        prediction_log("m", {"x": np.frombuffer(p.ljust(4 * (len(p) // 4 + 1), b"\0"), np.float32)}, request_id=str(i))
        for i, p in enumerate(payloads)
    ]
    framed = [len(r) + 16 for r in records]
    starts = np.concatenate([[0], np.cumsum(framed)])
    blob = bytearray(b"".join(frame(r) for r in records))
    position = data.draw(st.integers(0, len(blob) - 1))
    k = int(np.searchsorted(starts, position, side="right") - 1)
    if data.draw(st.booleans(), label="truncate"):
        blob = blob[:position]
        expected = [str(i) for i in range(k)]
    else:
        blob[position] ^= data.draw(st.integers(1, 255))
        in_header = position - starts[k] < 12
        expected = [str(i) for i in range(len(records)) if i < k or (not in_header and i > k)]
    directory = tmp_path_factory.mktemp("damaged")
    (directory / capture_name(0)).write_bytes(bytes(blob))
    summary = ReadSummary()
    try:
        assert read_ids([directory], summary=summary) == expected
    except TrainserveError as exc:
        assert expected == [] and "\n" not in str(exc)
    assert summary.after_start.said() is None  # a file nobody writes gained nothing while it was read


def test_a_capture_written_while_it_is_read_is_read_as_it_was_at_the_start(tmp_path, caplog):
    """A writer appending to the file being read (half a record there at the start), and starting a new file: the
    read ends at the snapshot, takes the half record for no damage, and counts all that came after it."""
    sent = batches(6)
    records = [prediction_log("m", b, request_id=f"r{i}") for i, b in enumerate(sent)]
    path = write_capture(tmp_path / capture_name(0), records[:2])
    with open(path, "ab") as tail:
        tail.write(frame(records[2])[:9])  # the writer is mid-record at the snapshot
    summary = ReadSummary()
    reading = read_capture([tmp_path], "m", summary=summary)
    assert next(reading).request_id == "r0"  # the snapshot is taken: now the capture grows
    with open(path, "ab") as tail:
        tail.write(frame(records[2])[9:] + frame(records[3]))
    write_capture(tmp_path / capture_name(1), records[4:])
    with caplog.at_level(logging.INFO):
        assert [r.request_id for r in reading] == ["r1"]
    assert (summary.files, summary.records, summary.kept, summary.damage) == (1, 2, 2, [])
    assert summary.as_dict()["after_start"] == {
        "records": 4,
        "files_grown": 1,
        "files_new": 1,
        "files_gone": 0,
        "why": "written after the read began: a read is of the capture as it was at its start",
    }
    assert "left out 4 record(s) written after the read began (1 file(s) grown, 1 new)" in caplog.text


def test_a_file_rotated_away_before_it_is_read_is_counted_gone(tmp_path):
    ids = write_batches(tmp_path, "m", batches(6), per_file=3)
    summary = ReadSummary()
    reading = read_capture([tmp_path], "m", summary=summary)
    assert next(reading).request_id == ids[0]
    (tmp_path / capture_name(1)).unlink()  # the writer's rotation deletes the oldest-but-one meanwhile
    assert [r.request_id for r in reading] == ids[1:3]
    assert summary.after_start.files_gone == 1 and summary.after_start.said().endswith("as it was at its start")
