"""TFRecord framing without TensorFlow, checked against TensorFlow's own reader and writer."""

from __future__ import annotations

import io

import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from trainserve.tfrecord import DamagedRecord, frame, iter_records

PAYLOADS = st.lists(st.binary(max_size=300), max_size=8)


@pytest.mark.integration
@settings(max_examples=60, deadline=None, derandomize=True)
@given(PAYLOADS)
def test_tensorflow_reads_what_we_write_and_we_read_what_it_writes(tmp_path_factory, payloads):
    ours = tmp_path_factory.mktemp("ours") / "records"
    ours.write_bytes(b"".join(frame(p) for p in payloads))
    assert [r.numpy() for r in tf.data.TFRecordDataset(str(ours))] == payloads

    theirs = tmp_path_factory.mktemp("theirs") / "records"
    with tf.io.TFRecordWriter(str(theirs)) as writer:
        for payload in payloads:
            writer.write(payload)
    assert theirs.read_bytes() == ours.read_bytes()
    with open(theirs, "rb") as stream:
        assert list(iter_records(stream)) == payloads


def _read_until_damage(data: bytes) -> tuple[list[bytes], DamagedRecord | None]:
    kept: list[bytes] = []
    try:
        for record in iter_records(io.BytesIO(data)):
            kept.append(record)
    except DamagedRecord as damage:
        return kept, damage
    return kept, None


@pytest.mark.unit
@settings(max_examples=80, deadline=None, derandomize=True)
@given(PAYLOADS.filter(bool), st.data())
def test_a_truncated_tail_keeps_every_whole_record_before_it(payloads, data):
    frames = [frame(p) for p in payloads]
    whole = b"".join(frames)
    cut = data.draw(st.integers(0, len(whole) - 1))
    kept, damage = _read_until_damage(whole[:cut])
    complete = 0
    while complete < len(frames) and sum(map(len, frames[: complete + 1])) <= cut:
        complete += 1
    assert kept == payloads[:complete]
    at_boundary = cut == sum(map(len, frames[:complete]))
    assert (damage is None) == at_boundary
    if damage:
        assert damage.offset == sum(map(len, frames[:complete])) and "truncated" in damage.reason


@pytest.mark.unit
@pytest.mark.parametrize(
    "where, reason",
    [(3, "length checksum"), (9, "length checksum"), (14, "data checksum"), (-1, "data checksum")],
    ids=["length", "length-crc", "data", "data-crc"],
)
def test_a_flipped_byte_in_the_second_record_is_found_there(where, reason):
    first, second = frame(b"first record"), bytearray(frame(b"second record"))
    second[where] ^= 0x40
    kept, damage = _read_until_damage(first + bytes(second) + frame(b"third"))
    assert kept == [b"first record"]
    assert damage.offset == len(first) and reason in damage.reason
