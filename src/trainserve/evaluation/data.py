"""Held-out data for evaluation: named inputs and labels, streamed in batches so memory stays bounded.

An `.npz` (`x_test`, or `x_test/<input>` for several inputs; `y_test`) is read member by member straight
from the zip (a 1M-example file is never loaded whole; a Fortran-ordered member, which cannot be read by
rows, is loaded whole); a `.csv` (`--label-column`) is one input per column, kept as text [N]: the
signature says what each column is (evaluation/plan.py converts); a `DIR/` of images per class is sent as
the files' bytes (`image_bytes`), labelled by folder name; `digits` is the split `trainserve train`
holds out, and `synthetic` is generated batch by batch. Labels stay as the file has them (numbers, or class
names that `encode_labels` turns into the model's class ids): which task they fit is decided against the
served signature (evaluation/plan.py).
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from trainserve.data import IMAGES, single_input_name
from trainserve.errors import TrainserveError
from trainserve.hashed_split import DIGESTS, HashedSplit, array_row_digests, csv_row_digests, file_digests
from trainserve.layout import SPLIT_INPUTS, SPLIT_LABEL_NAMES, SPLIT_LABELS, split_task
from trainserve.sources import load_dataset
from trainserve.sources.csv_table import label_column_values, read_csv_text
from trainserve.sources.image_folder import IMAGE_BYTES, list_images, read_files
from trainserve.sources.synthetic import SyntheticSpec, synthetic_examples
from trainserve.splits import read_provenance
from trainserve.task import Task

Batch = tuple[dict[str, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Column:
    """One input of the data: its key (npz `x_test/<key>`, a CSV column), one example's shape, its dtype."""

    key: str
    shape: tuple[int, ...]
    dtype: np.dtype

    def describe(self) -> str:
        return f"{self.dtype.name} {list(self.shape)}"


@dataclass
class EvalData:
    """`count` examples of named inputs with their labels, served in batches of at most `batch_size`."""

    name: str
    columns: dict[str, Column]
    labels: np.ndarray  # as the file has them: [N] or [N, T]; int, bool or float
    count: int
    label_names: list[str] = field(default_factory=list)
    task: Task | None = None  # what the shared split says the model predicts (None: decided from the labels)
    # Each example's content digest (trainserve.hashed_split) over a key column (None: the whole example), or
    # None where it cannot be known: how eval places these rows in another version's hashed split.
    digest_rows: Callable[[str | None], np.ndarray | None] | None = field(default=None, repr=False)

    def row_digests(self, key: str | None) -> np.ndarray | None:
        """The digests of the `count` examples evaluated, or None where they cannot be known."""
        digests = self.digest_rows(key) if self.digest_rows else None
        return None if digests is None else digests[: self.count]

    def batches(self, batch_size: int) -> Iterator[Batch]:
        raise NotImplementedError


@dataclass
class ArrayData(EvalData):
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    def batches(self, batch_size):
        for start in range(0, self.count, batch_size):
            end = min(start + batch_size, self.count)
            yield {k: a[start:end] for k, a in self.arrays.items()}, self.labels[start:end]


@dataclass
class NpzData(EvalData):
    path: Path | None = None
    members: dict[str, str] = field(default_factory=dict)  # input key -> member name in the zip

    def batches(self, batch_size):
        with zipfile.ZipFile(self.path) as archive, ExitStack() as stack:
            streams = {key: stack.enter_context(archive.open(member)) for key, member in self.members.items()}
            for stream in streams.values():
                _read_npy_header(stream, self.path)
            for start in range(0, self.count, batch_size):
                n = min(batch_size, self.count - start)
                columns = {k: self._read_rows(s, self.columns[k], start, n) for k, s in streams.items()}
                yield columns, self.labels[start : start + n]

    def _read_rows(self, stream, column: Column, start: int, n: int) -> np.ndarray:
        row = int(np.prod(column.shape)) * column.dtype.itemsize
        raw = stream.read(n * row)
        if len(raw) != n * row:
            raise TrainserveError(f"{self.path}: {self.members[column.key]} is truncated at example {start}")
        return np.frombuffer(raw, column.dtype).reshape(n, *column.shape)


@dataclass
class ImageFolderData(EvalData):
    """A folder of image files per class: each batch is the files' bytes (no decoding here: the served model
    decodes), labelled with the folder's name (the model's class names turn them into ids)."""

    paths: np.ndarray = field(default_factory=lambda: np.zeros(0, str))

    def batches(self, batch_size):
        for start in range(0, self.count, batch_size):
            end = min(start + batch_size, self.count)
            yield {IMAGE_BYTES: read_files(self.paths[start:end])}, self.labels[start:end]


def _open_image_folder(root: Path, limit: int | None) -> ImageFolderData:
    """Every image file under DIR/<class>/, in class and file order; labels are the class folders' names."""
    files, names, other = list_images(root)
    if not files:
        raise TrainserveError(f"{root} holds no image files: expected DIR/<class>/<.jpg .jpeg .png .bmp .gif files>")
    count = min(len(files), limit or len(files))
    labels = np.array([names[label] for _, label in files], dtype=str)[:count]
    paths = np.array([str(path) for path, _ in files], dtype=str)[:count]
    column = Column(IMAGE_BYTES, (), np.dtype(object))
    data = ImageFolderData(root.name or str(root), {IMAGE_BYTES: column}, labels, count, paths=paths)
    data.digest_rows = lambda key: file_digests(paths[:count]) if key is None else None
    return data


@dataclass
class SyntheticData(EvalData):
    spec: SyntheticSpec = field(default_factory=SyntheticSpec)
    seed: int = 1

    def batches(self, batch_size):
        for index, start in enumerate(range(0, self.count, batch_size)):
            n = min(batch_size, self.count - start)
            images, labels = synthetic_examples(self.spec, n, self.seed * 1_000_003 + index)
            yield {IMAGES: images}, labels


def open_eval_data(
    source: str,
    limit: int | None = None,
    synthetic: SyntheticSpec | None = None,
    label_column: str | None = None,
    seed: int = 0,
    split: HashedSplit | None = None,
) -> EvalData:
    """`digits` (the split training holds out by `split`, or with `seed`), `synthetic`, `FILE.npz` (x_test or
    x_test/<input>, y_test), `FILE.csv` (--label-column) or a `DIR/` of image files per class."""
    if source == "synthetic":
        spec = synthetic or SyntheticSpec()
        count = min(spec.size, limit or spec.size)
        labels = np.zeros(0, np.int64)  # generated with the inputs, batch by batch
        column = Column(IMAGES, tuple(spec.shape), np.dtype(np.uint8))
        names = [str(i) for i in range(spec.classes)]
        task = Task("classification", classes=spec.classes, label_names=tuple(names))
        return SyntheticData("synthetic", {IMAGES: column}, labels, count, names, task, spec=spec)
    if source == "digits":
        ds = load_dataset("digits", seed=seed, split=split)
        data = _in_memory("digits", ds.test, ds.y_test, limit, ds.label_names, ds.task)
        data.digest_rows = lambda key: array_row_digests(ds.test, ds.y_test) if key is None else None
        return data
    if source.endswith(".csv"):
        return _open_csv(Path(source), label_column, limit)
    if Path(source).is_dir():
        return _open_image_folder(Path(source), limit)
    return _open_npz(Path(source), limit)


def _open_csv(path: Path, label_column: str | None, limit: int | None) -> ArrayData:
    """Every column as text [N, 1]; labels typed as training types them (names stay names)."""
    header, body = read_csv_text(path, label_column)
    text = {name: np.array([row[i] for row in body], dtype=str) for i, name in enumerate(header)}
    labels, names = label_column_values(text.pop(label_column).tolist(), label_column, False, path)
    if names:
        labels = np.array(names, dtype=str)[labels]
    data = _in_memory(path.stem, text, labels, limit)
    data.digest_rows = lambda key: csv_row_digests(header, body, key) if key is None or key in header else None
    return data


def encode_labels(data: EvalData, model_names: list[str], model: str) -> EvalData:
    """Labels that are class names -> the model's class ids; a name the model lacks is a one-line error."""
    index = {name: i for i, name in enumerate(model_names)}
    unknown = sorted({str(v) for v in data.labels} - set(index))
    if unknown:
        shown = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        raise TrainserveError(
            f"{data.name}: label names {shown} are not classes of {model}: expected some of {', '.join(model_names)}"
        )
    labels = np.array([index[str(v)] for v in data.labels], np.int64)
    return replace(data, labels=labels, label_names=list(model_names))


def _in_memory(name, inputs: dict[str, np.ndarray], labels, limit, label_names=(), task=None) -> ArrayData:
    for key, array in inputs.items():
        if len(array) != len(labels):
            raise TrainserveError(
                f"{name}: {key!r} has {len(array)} examples for {len(labels)} labels: expected one each"
            )
    count = min(len(labels), limit or len(labels))
    columns = {k: Column(k, tuple(a.shape[1:]), a.dtype) for k, a in inputs.items()}
    return ArrayData(name, columns, labels[:count], count, list(label_names), task, arrays=inputs)


def _read_npy_header(fh, path) -> tuple[tuple[int, ...], np.dtype, bool]:
    """(shape, dtype, Fortran order?) of one .npy member, the stream left at its first value."""
    version = np.lib.format.read_magic(fh)
    reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = reader(fh)
    return shape, dtype, fortran


def _open_npz(path: Path, limit: int | None) -> EvalData:
    expected = "expected digits, synthetic, a .csv or an .npz with x_test (or x_test/<input>) and y_test"
    if not path.is_file():
        raise TrainserveError(f"data file {path} not found: {expected}")
    try:
        with zipfile.ZipFile(path) as archive:
            members = _input_members(path, {n for n in archive.namelist() if n.endswith(".npy")}, expected)
            headers = {}
            for key, member in members.items():
                with archive.open(member) as fh:
                    headers[key] = _read_npy_header(fh, path)
        with np.load(path, allow_pickle=False) as npz:
            labels = np.ascontiguousarray(npz[SPLIT_LABELS])
            names = [str(n) for n in npz[SPLIT_LABEL_NAMES]] if SPLIT_LABEL_NAMES in npz.files else []
            task = split_task(npz)
            fortran = any(header[2] for header in headers.values())  # such a member is not readable by rows
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, KeyError) as exc:
        raise TrainserveError(f"data file {path} is not a readable .npz ({exc})") from None
    columns = {}
    for key, (shape, dtype, _) in headers.items():
        if dtype.kind not in "biufU" or len(shape) < 1 or shape[0] != len(labels):
            raise TrainserveError(
                f"{path}: {members[key]} is {dtype} {list(shape)}: expected a numeric (or text) array with one row"
                f" per label ({len(labels)} in {SPLIT_LABELS})"
            )
        columns[key] = Column(key, tuple(shape[1:]), dtype)
    count = min(len(labels), limit or len(labels))
    if fortran:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: np.ascontiguousarray(npz[m[:-4]]) for k, m in members.items()}
        data = ArrayData(path.stem, columns, labels[:count], count, names, task, arrays=arrays)
    else:
        data = NpzData(path.stem, columns, labels[:count], count, names, task, path=path, members=members)
    data.digest_rows = _stored_digests(path, len(labels))
    return data


def _stored_digests(path: Path, count: int):
    """A split file's own row digests (written by training, under the key its provenance names), if any."""
    with np.load(path, allow_pickle=False) as npz:
        if DIGESTS not in npz.files or npz[DIGESTS].shape != (count,):
            return None
        digests = npz[DIGESTS]
    stored_key = ((read_provenance(path) or {}).get("split") or {}).get("key")
    return lambda key: digests if key == stored_key else None


def _input_members(path: Path, npy: set[str], expected: str) -> dict[str, str]:
    """Input key -> zip member: one `x_test` (named as training names it) or `x_test/<input>` each."""
    named = {m[len(SPLIT_INPUTS) + 1 : -4]: m for m in npy if m.startswith(SPLIT_INPUTS + "/")}
    single = f"{SPLIT_INPUTS}.npy" in npy
    if f"{SPLIT_LABELS}.npy" not in npy or single == bool(named):
        found = ", ".join(sorted(m[:-4] for m in npy)) or "none"
        raise TrainserveError(f"data file {path} has {found}: {expected}")
    if named:
        return named
    with zipfile.ZipFile(path) as archive, archive.open(f"{SPLIT_INPUTS}.npy") as fh:
        shape, dtype, _ = _read_npy_header(fh, path)
    return {single_input_name(dtype, len(shape)): f"{SPLIT_INPUTS}.npy"}
