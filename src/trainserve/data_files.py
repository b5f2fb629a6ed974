"""Your own data from files: `.npz` (one or several named inputs) and `.csv` (one column per input).

.npz: `x_train` / `x_test` (one input) or `x_train/<input>` / `x_test/<input>` (several), each any numeric
dtype and shape; `y_train` / `y_test`: integers -> classification, floats ([N] or [N, T]) -> regression;
`label_names` optional (classification).

.csv (`--label-column NAME`): a header row, then one example per row. Every other column becomes an input
of that name, shape [N, 1]: int64 when every value is an integer (counts, category ids for an Embedding),
float32 otherwise; text is refused (encode categories as integers first). The label column decides the
task the same way: all integers -> classification, otherwise regression. A `--test-fraction` of the rows,
drawn with `--seed`, is held out as the test split.
"""

from __future__ import annotations

import csv
import re
import zipfile
from pathlib import Path

import numpy as np

from trainserve.data import NPZ_KEYS, Dataset, build_dataset
from trainserve.errors import TrainserveError

INPUT_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.\-]*$")
INTEGER = re.compile(r"^[+-]?\d+$")


def check_input_name(name: str, where: str) -> str:
    if not INPUT_NAME.match(name):
        raise TrainserveError(
            f"{where}: input name {name!r} is not usable: expected a letter, then letters, digits, '_', '.' or '-'"
        )
    return name


def load_npz(path: Path) -> Dataset:
    """Read an .npz with `x_train y_train x_test y_test` (or `x_train/<input>`, `x_test/<input>`)."""
    if not path.is_file():
        raise TrainserveError(f"data file {path} not found: expected an .npz with keys {', '.join(NPZ_KEYS)}")
    try:
        with np.load(path, allow_pickle=False) as npz:
            files = list(npz.files)
            x = {split: _inputs(npz, files, f"x_{split}", path) for split in ("train", "test")}
            missing = [k for k in NPZ_KEYS if (x.get(k[2:]) is None if k.startswith("x_") else k not in files)]
            if missing:
                raise TrainserveError(
                    f"data file {path} lacks {', '.join(missing)}: expected keys {', '.join(NPZ_KEYS)}"
                    f" (or x_train/<input>, x_test/<input> for several inputs; found {', '.join(files) or 'none'})"
                )
            y_train, y_test = npz["y_train"], npz["y_test"]
            names = [str(n) for n in npz["label_names"]] if "label_names" in files else []
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise TrainserveError(f"data file {path} is not a readable .npz ({exc})") from None
    return build_dataset(path.stem, x["train"], y_train, x["test"], y_test, names, source=str(path))


def _inputs(npz, files: list[str], key: str, path: Path):
    """The array under `key`, or the dict of `key/<input>` arrays, or None when neither is there."""
    named = {f[len(key) + 1 :]: f for f in files if f.startswith(key + "/")}
    if key in files and named:
        raise TrainserveError(f"data file {path} has both {key} and {key}/<input> keys: expected one form")
    if key in files:
        return npz[key]
    if not named:
        return None
    return {check_input_name(name, f"data file {path}"): npz[f] for name, f in sorted(named.items())}


def load_csv(path: Path, label_column: str | None, test_fraction: float, seed: int) -> Dataset:
    """Read a CSV: every column but `label_column` becomes an input [N, 1]; a seeded fraction is held out."""
    inputs, labels = read_csv(path, label_column)
    count = len(labels)
    n_test = int(round(count * test_fraction))
    if not 1 <= n_test < count:
        raise TrainserveError(
            f"data file {path}: --test-fraction {test_fraction} of {count} rows: expected at least one row on each side"
        )
    order = np.random.default_rng(seed).permutation(count)
    test, train = np.sort(order[:n_test]), np.sort(order[n_test:])
    return build_dataset(
        path.stem,
        {k: v[train] for k, v in inputs.items()},
        labels[train],
        {k: v[test] for k, v in inputs.items()},
        labels[test],
        source=str(path),
    )


def read_csv(path: Path, label_column: str | None) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """(inputs by column name, each [N, 1]; labels [N]) of a CSV with a header row, every cell checked."""
    if not path.is_file():
        raise TrainserveError(f"data file {path} not found: expected a .csv with a header row")
    if not label_column:
        raise TrainserveError(f"data file {path}: a .csv needs --label-column NAME: expected the label's column")
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
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
    columns = {name: _column([r[i].strip() for r in body], name, path) for i, name in enumerate(header)}
    labels = columns.pop(label_column)[:, 0]
    return {check_input_name(name, f"data file {path}"): values for name, values in columns.items()}, labels


def _column(values: list[str], name: str, path: Path) -> np.ndarray:
    """One column as int64 [N, 1] (all integers) or float32 [N, 1]; anything else names the bad cell."""
    if all(INTEGER.match(v) for v in values):
        return np.array([int(v) for v in values], np.int64)[:, np.newaxis]
    try:
        return np.array([float(v) for v in values], np.float32)[:, np.newaxis]
    except ValueError:
        row = next(i for i, v in enumerate(values) if not _is_float(v))
        raise TrainserveError(
            f"data file {path} column {name!r} line {row + 2} is {values[row]!r}: expected a number"
            " (encode categories as integer ids)"
        ) from None


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
