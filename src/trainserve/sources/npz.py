""".npz files: `x_train` / `x_test` (one input) or `x_train/<input>` / `x_test/<input>` (several), each any
numeric dtype, shape and memory order; `y_train` / `y_test`: integers -> classification, floats ([N] or [N, T])
-> regression; `label_names` optional (classification). Read into arrays here, built into a Dataset by
`trainserve.data.build_dataset`.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trainserve.data import Dataset, build_dataset, check_input_name
from trainserve.errors import TrainserveError

NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")


@dataclass
class FileArrays:
    """What a data file holds: inputs (one array, or a dict of named ones) and labels per split."""

    x_train: np.ndarray | dict[str, np.ndarray]
    y_train: np.ndarray
    x_test: np.ndarray | dict[str, np.ndarray]
    y_test: np.ndarray
    label_names: list[str] = field(default_factory=list)


def read_npz(path: Path) -> FileArrays:
    """The arrays of an .npz with `x_train y_train x_test y_test` (or `x_train/<input>`, `x_test/<input>`)."""
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
    return FileArrays(x["train"], y_train, x["test"], y_test, names)


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


def load_npz(path: Path) -> Dataset:
    """The .npz's splits as a validated Dataset."""
    arrays = read_npz(path)
    return build_dataset(
        path.stem, arrays.x_train, arrays.y_train, arrays.x_test, arrays.y_test, arrays.label_names, str(path)
    )
