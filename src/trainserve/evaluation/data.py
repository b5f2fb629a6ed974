"""Held-out data for evaluation, streamed in batches so memory stays bounded.

An `.npz` is read member by member straight from the zip (a 1M-image file is never loaded whole),
`digits` is the same split `trainserve train` holds out, and `synthetic` is generated batch by batch.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trainserve.data import SyntheticSpec, as_labels, load_dataset, synthetic_examples
from trainserve.errors import TrainserveError


@dataclass
class EvalData:
    """`count` examples of uint8 images shaped `shape`, with integer labels, served in batches."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    count: int
    label_names: list[str] = field(default_factory=list)
    max_label: int = 0

    def batches(self, batch_size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        raise NotImplementedError


@dataclass
class ArrayData(EvalData):
    x: np.ndarray | None = None
    y: np.ndarray | None = None

    def batches(self, batch_size):
        for start in range(0, self.count, batch_size):
            yield self.x[start : start + batch_size], self.y[start : start + batch_size]


@dataclass
class NpzData(EvalData):
    path: Path | None = None
    y: np.ndarray | None = None
    x_offset: int = 0

    def batches(self, batch_size):
        row = int(np.prod(self.shape)) * self.dtype.itemsize
        with zipfile.ZipFile(self.path) as archive, archive.open("x_test.npy") as fh:
            _read_npy_header(fh, self.path)
            for start in range(0, self.count, batch_size):
                n = min(batch_size, self.count - start)
                raw = fh.read(n * row)
                if len(raw) != n * row:
                    raise TrainserveError(f"{self.path}: x_test is truncated at example {start}")
                yield np.frombuffer(raw, self.dtype).reshape(n, *self.shape), self.y[start : start + n]


@dataclass
class SyntheticData(EvalData):
    spec: SyntheticSpec = field(default_factory=SyntheticSpec)
    seed: int = 1

    def batches(self, batch_size):
        for index, start in enumerate(range(0, self.count, batch_size)):
            n = min(batch_size, self.count - start)
            yield synthetic_examples(self.spec, n, self.seed * 1_000_003 + index)


def _read_npy_header(fh, path) -> tuple[tuple[int, ...], np.dtype]:
    version = np.lib.format.read_magic(fh)
    reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = reader(fh)
    if fortran:
        raise TrainserveError(f"{path}: x_test is stored in Fortran order: expected C order (np.savez default)")
    return shape, dtype


def open_eval_data(source: str, limit: int | None = None, synthetic: SyntheticSpec | None = None) -> EvalData:
    """`digits`, `synthetic` or `FILE.npz` (with x_test, y_test; label_names optional)."""
    if source == "synthetic":
        spec = synthetic or SyntheticSpec()
        count = min(spec.size, limit or spec.size)
        return SyntheticData(
            "synthetic", spec.shape, np.dtype(np.uint8), count, [str(i) for i in range(spec.classes)],
            spec.classes - 1, spec=spec,
        )  # fmt: skip
    if source == "digits":
        ds = load_dataset("digits")
        count = min(len(ds.x_test), limit or len(ds.x_test))
        return ArrayData(
            "digits", ds.input_shape, ds.x_test.dtype, count, ds.label_names, int(ds.y_test.max()),
            x=ds.x_test, y=ds.y_test,
        )  # fmt: skip
    return _open_npz(Path(source), limit)


def _open_npz(path: Path, limit: int | None) -> EvalData:
    if not path.is_file():
        raise TrainserveError(f"data file {path} not found: expected digits, synthetic or an .npz with x_test, y_test")
    try:
        with zipfile.ZipFile(path) as archive:
            members = {n[:-4] for n in archive.namelist() if n.endswith(".npy")}
            missing = [k for k in ("x_test", "y_test") if k not in members]
            if missing:
                raise TrainserveError(f"data file {path} lacks {', '.join(missing)}: expected x_test and y_test")
            with archive.open("x_test.npy") as fh:
                shape, dtype = _read_npy_header(fh, path)
        with np.load(path, allow_pickle=False) as npz:
            y = npz["y_test"]
            names = [str(n) for n in npz["label_names"]] if "label_names" in npz.files else []
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise TrainserveError(f"data file {path} is not a readable .npz ({exc})") from None
    if dtype != np.uint8 or len(shape) not in (3, 4):
        raise TrainserveError(f"{path}: x_test is {dtype} {list(shape)}: expected uint8 [N, H, W] or [N, H, W, C]")
    y = as_labels(y, f"{path}: y_test")  # the same label rules as training's
    if len(y) != shape[0]:
        raise TrainserveError(f"{path}: y_test has {len(y)} labels for {shape[0]} images: expected one per image")
    image = tuple(shape[1:]) + ((1,) if len(shape) == 3 else ())
    count = min(shape[0], limit or shape[0])
    return NpzData(path.stem, image, dtype, count, names, int(y.max(initial=0)), path=path, y=y)
