"""The labels file, read once into compact sorted arrays: 8 bytes of hash, a class and a slice code per label, so
a million labels take tens of megabytes and the capture, however long, is streamed past them.

Format: CSV with a header, UTF-8 with or without a byte-order mark (a spreadsheet's "CSV UTF-8" writes one), any
line ending (a spreadsheet on Windows writes CRLF); spaces around a header name are ignored. `--key` (request_id)
holds the request id the client sent as `x-request-id`; `--row-column` (request_row), where present, the example's
row within a batched request (0 for the first; `trainserve proxy export` writes both); `--label-column` (label)
the true class, as its index or its name, or for a regression model the true number. Other columns may be named
by `--slice`.

Bad rows are counted by kind, never a traceback, and the rest are scored: `missing id`, `bad row index`,
`unparseable label` (neither an integer nor a class name; for regression, not a finite number), `unknown class`
(an index the model does not have).
Two rows for one example: agreeing ones count once (`duplicate`), disagreeing ones are not scored at all
(`conflicting`: which would be true?).
"""

from __future__ import annotations

import csv
import hashlib
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trainserve.errors import TrainserveError
from trainserve.shards import Shard

OTHER = "(other)"  # slice values past MAX_SLICE_VALUES
MAX_SLICE_VALUES = 50
ENCODING = "utf-8-sig"  # UTF-8, its byte-order mark (if any) dropped
BAD_KINDS = ("missing id", "bad row index", "unparseable label", "unknown class")


def example_key(request_id: str, row: int) -> int:
    """A 64-bit hash of (request id, row): the join's key."""
    return int.from_bytes(hashlib.blake2b(f"{request_id}\x1f{row}".encode(), digest_size=8).digest(), "little")


def request_hash(request_id: str) -> int:
    """Which shard a request belongs to: all rows of a request, and every version's answer to it, in one shard,
    so pairs and duplicates are found within a shard and the shards' counts add exactly."""
    return int.from_bytes(hashlib.blake2b(request_id.encode(), digest_size=8).digest(), "little")


@dataclass
class SliceCodes:
    """One labels-file column's values as small integers (the first MAX_SLICE_VALUES seen; the rest OTHER)."""

    column: str
    values: list[str] = field(default_factory=list)
    codes: dict[str, int] = field(default_factory=dict)

    def code(self, value: str) -> int:
        if value not in self.codes:
            if len(self.values) >= MAX_SLICE_VALUES:
                value = OTHER
                if OTHER in self.codes:
                    return self.codes[OTHER]
            self.codes[value] = len(self.values)
            self.values.append(value)
        return self.codes[value]


@dataclass
class LabelTable:
    """The labels of one shard, sorted by key: `keys` uint64, `labels` int32 (float64 for regression), `slices`
    {column: int32 codes}."""

    keys: np.ndarray
    labels: np.ndarray
    slices: dict[str, SliceCodes]
    slice_codes: dict[str, np.ndarray]
    rows: int  # data rows of this shard's requests (and, for shard 0, those without an id)
    bad: Counter  # kind -> rows
    duplicates: int  # rows repeating an example's label
    conflicting: int  # examples given different labels (not scored)
    has_row_column: bool

    def find(self, keys: np.ndarray) -> np.ndarray:
        """Each key's index in the table, -1 where it has no label."""
        at = np.searchsorted(self.keys, keys)
        at = np.minimum(at, max(len(self.keys) - 1, 0))
        found = (self.keys[at] == keys) if len(self.keys) else np.zeros(len(keys), bool)
        return np.where(found, at, -1)

    def counts(self) -> dict:
        return {
            "rows": self.rows,
            "labels": int(len(self.keys)),
            "bad_rows": {kind: self.bad.get(kind, 0) for kind in BAD_KINDS},
            "duplicate_rows": self.duplicates,
            "conflicting_examples": self.conflicting,
        }


def read_labels(
    path: Path,
    key: str,
    row_column: str,
    label_column: str,
    class_of: dict[str, int],
    classes: int,
    slices: tuple[str, ...] = (),
    shard: Shard | None = None,
    regression: bool = False,
) -> LabelTable:
    """Read `path` (this shard's requests only). `class_of` maps a class name to its index; an integer label
    must lie in [0, classes); a regression label is any finite number. One error line when the header lacks a
    named column."""
    shard = shard or Shard()
    keys: list[int] = []
    labels: list = []
    parse = _number_of if regression else lambda text: _class_of(text, class_of, classes)
    codes = {c: SliceCodes(c) for c in slices}
    coded: dict[str, list[int]] = {c: [] for c in slices}
    bad: Counter = Counter()
    rows = 0
    try:
        with open(path, newline="", encoding=ENCODING) as stream:
            reader = csv.DictReader(stream)
            header = reader.fieldnames = [name.strip() for name in reader.fieldnames or []]
            _check_header(path, header, key, label_column, slices)
            has_rows = row_column in header
            for record in reader:
                request = (record.get(key) or "").strip()
                if not request:  # no shard's by its id: the first shard counts it, so the shards' counts add
                    rows += shard.index == 0
                    bad["missing id"] += shard.index == 0
                    continue
                if not shard.takes(request_hash(request) % shard.count):
                    continue
                rows += 1
                row = _row_of(record.get(row_column) if has_rows else "0")
                if row is None:
                    bad["bad row index"] += 1
                    continue
                label, kind = parse((record.get(label_column) or "").strip())
                if kind:
                    bad[kind] += 1
                    continue
                keys.append(example_key(request, row))
                labels.append(label)
                for column in slices:
                    coded[column].append(codes[column].code((record.get(column) or "").strip()))
    except UnicodeDecodeError as exc:
        raise _not_utf8(path, exc) from None
    except csv.Error as exc:
        raise TrainserveError(f"--labels {path}: not a CSV file ({exc})") from None
    return _table(keys, np.array(labels, np.float64 if regression else np.int32), codes, coded, rows, bad, has_rows)


def read_header(path: Path) -> list[str]:
    """The labels file's column names, as read_labels reads them (byte-order mark dropped, names stripped)."""
    try:
        with open(path, newline="", encoding=ENCODING) as stream:
            return [name.strip() for name in next(csv.reader(stream), [])]
    except UnicodeDecodeError as exc:
        raise _not_utf8(path, exc) from None
    except csv.Error as exc:
        raise TrainserveError(f"--labels {path}: not a CSV file ({exc})") from None


def _not_utf8(path: Path, exc: UnicodeDecodeError) -> TrainserveError:
    return TrainserveError(f"--labels {path}: not UTF-8 text ({exc.reason} at byte {exc.start})")


def _check_header(path: Path, header: list[str], key: str, label_column: str, slices: tuple[str, ...]) -> None:
    """One error line naming the missing column and the header as read, each name as repr writes it, so a character
    that does not show (a zero-width space, a non-breaking one) shows."""
    for column, flag in ((key, "--key"), (label_column, "--label-column")):
        if column not in header:
            said = ", ".join(repr(name) for name in header) or "no header"
            raise TrainserveError(f"--labels {path}: no column {column!r} ({flag}); its header has: {said}")


def _row_of(text: str | None) -> int | None:
    try:
        row = int((text or "").strip())
    except ValueError:
        return None
    return row if row >= 0 else None


def _class_of(text: str, class_of: dict[str, int], classes: int) -> tuple[int, str | None]:
    """(class, None), or (-1, the kind of bad label)."""
    if text in class_of:
        return class_of[text], None
    try:
        value = float(text)
    except ValueError:
        return -1, "unparseable label"
    if not value.is_integer():
        return -1, "unparseable label"
    if not 0 <= value < classes:
        return -1, "unknown class"
    return int(value), None


def _number_of(text: str) -> tuple[float, str | None]:
    """(the true number, None), or (nan, "unparseable label") for text that is no finite number."""
    try:
        value = float(text)
    except ValueError:
        return math.nan, "unparseable label"
    return (value, None) if math.isfinite(value) else (math.nan, "unparseable label")


def _table(keys, labels_a: np.ndarray, codes, coded, rows, bad, has_rows) -> LabelTable:
    keys_a = np.array(keys, np.uint64)
    coded_a = {c: np.array(v, np.int32) for c, v in coded.items()}
    order = np.argsort(keys_a, kind="stable")
    keys_a, labels_a = keys_a[order], labels_a[order]
    coded_a = {c: v[order] for c, v in coded_a.items()}
    # Runs of one key: the first of each run kept; a run whose labels disagree is dropped whole.
    starts = np.r_[True, keys_a[1:] != keys_a[:-1]] if len(keys_a) else np.zeros(0, bool)
    run = np.cumsum(starts) - 1
    first_label = labels_a[starts][run] if len(keys_a) else labels_a
    disagrees = np.zeros(int(starts.sum()), bool)
    np.logical_or.at(disagrees, run, labels_a != first_label)
    keep = starts & ~disagrees[run] if len(keys_a) else starts
    return LabelTable(
        keys=keys_a[keep],
        labels=labels_a[keep],
        slices=codes,
        slice_codes={c: v[keep] for c, v in coded_a.items()},
        rows=rows,
        bad=bad,
        duplicates=int(len(keys_a) - starts.sum()),
        conflicting=int(disagrees.sum()),
        has_row_column=has_rows,
    )
