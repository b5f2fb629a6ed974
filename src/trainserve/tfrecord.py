"""TFRecord framing without TensorFlow: the container of TF Serving's warmup requests and of captured traffic.

Each record is `uint64 length | uint32 masked CRC32C(length) | data | uint32 masked CRC32C(data)`, all
little-endian (tensorflow/core/lib/io/record_writer.cc). The light image has no TensorFlow, so the capture
proxy and the replay tools frame and check records here; TensorFlow's own reader reads what this writes (test).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import BinaryIO

import google_crc32c

_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")
_MASK_DELTA = 0xA282EAD8


def masked_crc(data: bytes) -> int:
    """TensorFlow's masked CRC32C: a CRC of data that holds CRCs would otherwise be weak."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame(data: bytes) -> bytes:
    """One record, ready to append to a TFRecord file."""
    length = _HEADER.pack(len(data), 0)[:8]
    return length + struct.pack("<I", masked_crc(length)) + data + _FOOTER.pack(masked_crc(data))


class DamagedRecord(ValueError):
    """A file's records stop at `offset`: a truncated tail (a killed writer) or a checksum that does not match."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"damaged record at byte {offset}: {reason}")
        self.offset = offset
        self.reason = reason


def iter_records(stream: BinaryIO) -> Iterator[bytes]:
    """Yield each record's bytes in order; raise DamagedRecord at the first one that cannot be trusted.

    Every record before the damage has been yielded by then, so a caller can keep them and say what was lost.
    """
    offset = 0
    while True:
        header = stream.read(_HEADER.size)
        if not header:
            return
        if len(header) < _HEADER.size:
            raise DamagedRecord(offset, f"truncated header ({len(header)} of {_HEADER.size} bytes)")
        length, length_crc = _HEADER.unpack(header)
        if masked_crc(header[:8]) != length_crc:
            raise DamagedRecord(offset, "length checksum does not match (not a TFRecord file, or corrupt)")
        data = stream.read(length)
        footer = stream.read(_FOOTER.size)
        if len(data) < length or len(footer) < _FOOTER.size:
            raise DamagedRecord(offset, f"truncated record ({len(data)} of {length} bytes)")
        if masked_crc(data) != _FOOTER.unpack(footer)[0]:
            raise DamagedRecord(offset, "data checksum does not match")
        yield data
        offset += _HEADER.size + length + _FOOTER.size
