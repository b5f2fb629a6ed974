""".csv files (`--label-column NAME`): a header row, then one example per row; every other column becomes an
input of that name, shape [N] (one value per example: what a CSV row or a JSON instance holds), typed by its
content: numbers -> float32 (an empty cell is NaN, a missing value), anything else -> a string category (an
empty cell is the empty string, a missing value). Columns named by `--categorical` are string categories
whatever they hold (ids). The label column: all integers -> classification with those ids, other numbers ->
regression, text -> classification whose classes are the sorted names. The result is a `tabular` data set,
preprocessed inside the model (training/preprocessing.py).
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trainserve.data import Dataset, build_dataset, check_input_name
from trainserve.errors import TrainserveError
from trainserve.hashed_split import HashedSplit, csv_row_digests, split_by_digest

INTEGER = re.compile(r"^[+-]?\d+$")


@dataclass
class CsvTable:
    """A CSV's columns: inputs by name, each [N] float32 (NaN: missing) or str ("": missing), and
    labels [N] (int64 ids, float32 targets, or int64 indexes into `label_names` for text labels)."""

    inputs: dict[str, np.ndarray]
    labels: np.ndarray
    label_names: list[str] = field(default_factory=list)


def read_csv_text(path: Path, label_column: str | None) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of a CSV with a header row and a `label_column`; every row as long as the header,
    cells stripped of surrounding blanks. A byte-order mark (Excel's "CSV UTF-8") is not part of the first name."""
    if not path.is_file():
        raise TrainserveError(f"data file {path} not found: expected a .csv with a header row")
    if not label_column:
        raise TrainserveError(f"data file {path}: a .csv needs --label-column NAME: expected the label's column")
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:  # -sig: drops a leading BOM, if any
            rows = list(csv.reader(fh))
    except (csv.Error, UnicodeDecodeError) as exc:
        raise TrainserveError(f"data file {path} is not a readable CSV ({exc}): expected UTF-8 text") from None
    if not rows:
        raise TrainserveError(f"data file {path} is empty: expected a header row and examples")
    header, body = [h.strip() for h in rows[0]], [r for r in rows[1:] if r]
    if label_column not in header:
        raise TrainserveError(
            f"data file {path} has no column {label_column!r}: expected --label-column to name one of"
            f" {', '.join(header)}"
        )
    if len(set(header)) != len(header) or len(header) < 2:
        raise TrainserveError(f"data file {path}: columns {header}: expected unique names, a label and an input")
    for number, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise TrainserveError(f"data file {path} line {number} has {len(row)} fields: expected {len(header)}")
    if not body:
        raise TrainserveError(f"data file {path} has a header but no rows: expected examples")
    return header, [[cell.strip() for cell in row] for row in body]


def read_csv(path: Path, label_column: str | None, categorical: tuple[str, ...] = (), text=None) -> CsvTable:
    """The CSV's inputs typed by content (`categorical` columns as text) and its labels (`text`: the file's
    (header, rows) where already read)."""
    header, body = text or read_csv_text(path, label_column)
    unknown = sorted(set(categorical) - set(header))
    if unknown:
        raise TrainserveError(
            f"--categorical {','.join(unknown)}: data file {path} has no such column:"
            f" expected some of {', '.join(header)}"
        )
    text = {name: [row[i] for row in body] for i, name in enumerate(header)}
    labels, label_names = label_column_values(text.pop(label_column), label_column, label_column in categorical, path)
    inputs = {
        check_input_name(name, f"data file {path}"): _input_column(values, name, name in categorical, path)
        for name, values in text.items()
    }
    return CsvTable(inputs, labels, label_names)


def held_out_rows(count: int, test_fraction: float, seed: int, path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(training rows, test rows): a `test_fraction` of `count` rows drawn with `seed`, each side in order."""
    n_test = int(round(count * test_fraction))
    if not 1 <= n_test < count:
        raise TrainserveError(
            f"data file {path}: --test-fraction {test_fraction} of {count} rows: expected at least one row on each side"
        )
    order = np.random.default_rng(seed).permutation(count)
    return np.sort(order[n_test:]), np.sort(order[:n_test])


def _input_column(values: list[str], name: str, categorical: bool, path: Path) -> np.ndarray:
    """float32 [N] with NaN where a cell is empty, or str [N] ("" where empty): numbers unless
    declared categorical or some cell is not a number."""
    if all(v == "" for v in values):
        raise TrainserveError(
            f"data file {path} column {name!r} is empty in every row: expected at least one value (or drop the column)"
        )
    numbers = None if categorical else _numbers(values)
    if numbers is None:
        return np.array(values, dtype=str)
    bad = next((i for i, v in enumerate(numbers) if math.isinf(v)), None)
    if bad is not None:
        raise TrainserveError(
            f"data file {path} column {name!r} line {bad + 2} is {values[bad]!r}: expected a finite number"
            " (an empty cell for a missing value)"
        )
    return np.array(numbers, np.float32)


def _numbers(values: list[str]) -> list[float] | None:
    """The column as floats (NaN for empty cells), or None when some cell is not a number."""
    try:
        return [math.nan if v == "" else float(v) for v in values]
    except ValueError:
        return None


def label_column_values(values: list[str], name: str, categorical: bool, path: Path) -> tuple[np.ndarray, list[str]]:
    """(labels, names): integer ids, float targets, or indexes into the sorted names of text labels."""
    empty = next((i for i, v in enumerate(values) if v == ""), None)
    if empty is not None:
        raise TrainserveError(
            f"data file {path} label column {name!r} is empty at line {empty + 2}: expected a label in every row"
        )
    if not categorical and all(INTEGER.match(v) for v in values):
        return np.array([int(v) for v in values], np.int64), []
    numbers = None if categorical else _numbers(values)
    if numbers is not None:
        return np.array(numbers, np.float32), []
    names = sorted(set(values))
    index = {n: i for i, n in enumerate(names)}
    return np.array([index[v] for v in values], np.int64), names


def load_csv(
    path: Path,
    label_column: str | None,
    test_fraction: float,
    seed: int,
    categorical=(),
    split: HashedSplit | None = None,
) -> Dataset:
    """A CSV's columns as a tabular data set. Held out: the rows `split` puts there by a keyed hash of their
    cells as read (or of its key column), or (None: a version trained before hashed splits) a `test_fraction`
    of the rows drawn with `seed`."""
    header, body = read_csv_text(path, label_column)
    table = read_csv(path, label_column, tuple(categorical), (header, body))
    if split is None:
        train, test = held_out_rows(len(table.labels), test_fraction, seed, path)
    else:
        if split.key is not None and split.key not in header:
            raise TrainserveError(
                f"--split-key {split.key}: data file {path} has no such column: expected one of {', '.join(header)}"
            )
        digests = csv_row_digests(header, body, split.key)
        classes = (table.labels, table.label_names) if table.labels.dtype.kind in "iu" else None
        train, test = split_by_digest(digests, split, f"data file {path}", classes)
    pick = lambda rows: {k: v[rows] for k, v in table.inputs.items()}  # noqa: E731
    dataset = build_dataset(
        path.stem,
        pick(train),
        table.labels[train],
        pick(test),
        table.labels[test],
        table.label_names,
        source=str(path),
        tabular=True,
    )
    return dataset if split is None else dataset.with_hashed_split(split, table.labels, test, digests)
