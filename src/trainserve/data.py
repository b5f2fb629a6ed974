"""Data sets: the Dataset type, its checks and fingerprint, and the held-out split training shares.

A data set is named inputs (each any numeric dtype, shape and memory order) and labels: integer labels make
a classification task (K classes), float labels a regression one (T targets). Where data comes from is
`trainserve.sources`: one module per kind (built-in sets, `.npz`, `.csv`, folders of images), each building
its Dataset with `build_dataset` here, so every source is checked alike. A CSV makes a `tabular` data set:
float32 (NaN: missing) and str columns, preprocessed in the model (training/preprocessing.py).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

import numpy as np

from trainserve.errors import TrainserveError
from trainserve.hashed_split import HashedSplit, class_fractions
from trainserve.task import Task

IMAGES = "images"  # the input name of image data (the built-in sources, and a single uint8 [N, H, W(, C)] array)
SINGLE = "x"  # the input name of any other single array (`x_train` in an .npz)
INPUT_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.\-]*$")


@dataclass(frozen=True)
class ImageFormat:
    """What a model sees of an image file: `height` x `width` pixels, `channels` (1 gray, 3 RGB), uint8."""

    height: int
    width: int
    channels: int = 3

    def to_json(self) -> dict:
        return {"height": self.height, "width": self.width, "channels": self.channels}

    @classmethod
    def from_json(cls, raw: dict) -> ImageFormat:
        return cls(int(raw["height"]), int(raw["width"]), int(raw.get("channels", 3)))


@dataclass
class Dataset:
    """Named inputs and labels, split into train and test; `single` when the file held one `x_train`."""

    name: str
    train: dict[str, np.ndarray]
    y_train: np.ndarray
    test: dict[str, np.ndarray]
    y_test: np.ndarray
    task: Task
    single: bool = True
    tabular: bool = False  # CSV columns: float32 with NaN for missing, str categories; preprocessed in the model
    image: ImageFormat | None = None  # image files: the one input holds their paths, decoded in the model
    content_digest: str | None = None  # image files: sha256 over their bytes (the paths say nothing of them)
    skipped: dict = field(default_factory=dict)  # image files: what the scan left out, for the run summary
    # A split by keyed hash (trainserve.hashed_split): its scheme and per-class held-out shares, and each
    # held-out example's content digest. None where the source has a fixed split (a file's x_test, Keras sets).
    hashed_split: dict | None = None
    test_digests: np.ndarray | None = None

    @property
    def x_train(self) -> np.ndarray:
        return self._only(self.train)

    @property
    def x_test(self) -> np.ndarray:
        return self._only(self.test)

    def _only(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        if len(inputs) != 1:
            raise TrainserveError(f"{self.name} has inputs {', '.join(inputs)}: expected a single input here")
        return next(iter(inputs.values()))

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.x_train.shape[1:])

    @property
    def num_classes(self) -> int:
        return self.task.classes

    @property
    def label_names(self) -> list[str]:
        return list(self.task.label_names)

    def __len__(self) -> int:
        return len(self.y_train)

    def fingerprint(self) -> str:
        """sha256 over every array: names exactly which data a model was trained and tested on."""
        if self.content_digest is not None:
            return self.content_digest
        digest = hashlib.sha256()
        arrays = [*self.train.values(), self.y_train, *self.test.values(), self.y_test]
        if not self.single:
            digest.update(str(sorted(self.train)).encode())
        for array in arrays:
            digest.update(str((array.dtype.str, array.shape)).encode())
            digest.update(np.ascontiguousarray(array).tobytes())
        return digest.hexdigest()

    def with_hashed_split(self, split: HashedSplit, labels: np.ndarray, test: np.ndarray, digests: np.ndarray):
        """This data set, marked as split by `split`: `labels` and `digests` of every example, `test` the
        held-out indexes. Records the scheme and each class's held-out share (the hash stratifies only roughly)."""
        held = np.zeros(len(digests), bool)
        held[test] = True
        self.hashed_split = split.to_json()
        if self.task.kind == "classification":
            self.hashed_split["class_fractions"] = class_fractions(labels, held, self.label_names)
        self.test_digests = digests[test]
        return self

    def split_validation(
        self, fraction: float, seed: int
    ) -> tuple[dict[str, np.ndarray], np.ndarray, dict, np.ndarray]:
        """(train inputs, train labels, validation inputs, validation labels): `fraction` of the training
        examples, drawn with `seed`, held back for the per-epoch metrics. The test split is left alone."""
        count = len(self.y_train)
        n_val = int(round(count * fraction)) if fraction > 0 else 0
        if fraction > 0 and not 1 <= n_val < count:
            raise TrainserveError(
                f"--validation-split {fraction} of {count} training examples leaves none for training or"
                " validation: expected a fraction that keeps at least one example on each side"
            )
        order = np.random.default_rng(seed).permutation(count)
        held, kept = np.sort(order[:n_val]), np.sort(order[n_val:])
        pick = lambda idx: {k: v[idx] for k, v in self.train.items()}  # noqa: E731
        return pick(kept), self.y_train[kept], pick(held), self.y_train[held]


def build_dataset(
    name: str,
    x_train: np.ndarray | dict[str, np.ndarray],
    y_train: np.ndarray,
    x_test: np.ndarray | dict[str, np.ndarray],
    y_test: np.ndarray,
    label_names: list[str] | None = None,
    source: str = "",
    tabular: bool = False,
    image: ImageFormat | None = None,
) -> Dataset:
    """Check every array against the others; decide the task from the labels. One array (not a dict) is a
    single input: `images` when uint8 [N, H, W] (gains a channel axis) or [N, H, W, C], else `x`. Arrays are
    made C-ordered (a Fortran-ordered file is as good as any), labels too."""
    where = source or name
    single = not isinstance(x_train, dict)
    train, test = (_named(x, single, x_train) for x in (x_train, x_test))
    y_train, y_test = np.ascontiguousarray(y_train), np.ascontiguousarray(y_test)
    if sorted(train) != sorted(test):
        raise TrainserveError(
            f"{where}: x_train has inputs {sorted(train)} but x_test has {sorted(test)}: expected the same inputs"
        )
    for input_name in train:
        text = tabular or image is not None  # a CSV's categories, image files' paths
        _check_input(where, input_name, train[input_name], test[input_name], (y_train, y_test), single, text)
    if not len(y_test):
        raise TrainserveError(f"{where}: x_test is empty: expected at least one held-out example")
    y_train, y_test, task = labels_and_task(y_train, y_test, label_names, where)
    return Dataset(name, train, y_train, test, y_test, task, single, tabular, image)


def _check_input(
    where: str, name: str, a: np.ndarray, b: np.ndarray, labels: tuple, single: bool, tabular: bool
) -> None:
    """One input of both splits: numeric (finite, unless a CSV column: NaN is its missing value; or text, a
    CSV's categories), one dtype, one example shape, as many examples as labels."""
    keys = {split: f"x_{split}" if single else f"x_{split}/{name}" for split in ("train", "test")}
    for x, key in ((a, keys["train"]), (b, keys["test"])):
        if not (tabular and x.dtype.kind == "U"):
            _numeric(x, f"{where}: {key}", finite=not tabular)
    if a.dtype != b.dtype and not a.dtype.kind == b.dtype.kind == "U":  # text: numpy's width may differ
        raise TrainserveError(f"{where}: {keys['test']} has dtype {b.dtype}: expected {a.dtype}, as {keys['train']}")
    if a.shape[1:] != b.shape[1:]:
        what = "image" if name == IMAGES else "example"
        raise TrainserveError(
            f"{where}: {keys['train']} {what}s are {a.shape[1:]} but {keys['test']} {what}s are {b.shape[1:]}:"
            f" expected one {what} shape"
        )
    for x, y, split in ((a, labels[0], "train"), (b, labels[1], "test")):
        if len(x) != len(y):
            raise TrainserveError(
                f"{where}: {keys[split]} has {len(x)} examples but y_{split} has {len(y)}: expected equal lengths"
            )


def _named(x, single: bool, first) -> dict[str, np.ndarray]:
    """The inputs of one split, C-ordered; a single array is named after `first` (x_train), so both agree."""
    if not single:
        return {k: np.ascontiguousarray(v) for k, v in x.items()}
    x, first = np.ascontiguousarray(x), np.asarray(first)
    name = single_input_name(first.dtype, first.ndim)
    return {name: x[..., np.newaxis] if name == IMAGES and x.ndim == 3 else x}


def check_input_name(name: str, where: str) -> str:
    if not INPUT_NAME.match(name):
        raise TrainserveError(
            f"{where}: input name {name!r} is not usable: expected a letter, then letters, digits, '_', '.' or '-'"
        )
    return name


def single_input_name(dtype: np.dtype, ndim: int) -> str:
    """The name a file's one unnamed input array gets: `images` for uint8 [N, H, W(, C)] (a channel axis is
    added to [N, H, W]), `x` for anything else. Training and evaluation name it alike."""
    return IMAGES if dtype == np.uint8 and ndim in (3, 4) else SINGLE


def _numeric(x: np.ndarray, what: str, finite: bool = True) -> np.ndarray:
    if x.dtype.kind not in "biuf" or x.ndim < 1:
        raise TrainserveError(
            f"{what} has dtype {x.dtype} and shape {x.shape}: expected a numeric array [N, ...] (bool, int, float;"
            " text categories and missing values come in a .csv)"
        )
    if finite and x.dtype.kind == "f" and not np.all(np.isfinite(x)):
        raise TrainserveError(
            f"{what} holds NaN or infinite values: expected finite numbers (a .csv's empty cells are missing values)"
        )
    return x


def labels_and_task(y_train, y_test, label_names, where: str) -> tuple[np.ndarray, np.ndarray, Task]:
    """Integer labels -> classification (int64 [N]); float labels -> regression (float32 [N, T])."""
    kinds = [y.dtype.kind for y in (y_train, y_test)]
    if all(k in "biu" for k in kinds):
        y_train, y_test = (as_labels(y, f"{where}: {k}") for y, k in ((y_train, "y_train"), (y_test, "y_test")))
        observed = int(max(y_train.max(initial=0), y_test.max(initial=0))) + 1
        names = list(label_names or [str(i) for i in range(int(y_train.max(initial=0)) + 1)])
        if observed > len(names):
            raise TrainserveError(
                f"{where}: label {observed - 1} is out of range: expected labels in [0, {len(names)})"
                " (the classes seen in y_train, or label_names)"
            )
        if len(names) < 2 or len(np.unique(y_train)) < 2:
            raise TrainserveError(f"{where}: y_train holds one class: expected at least 2 classes")
        return y_train, y_test, Task("classification", classes=len(names), label_names=tuple(names))
    if all(k == "f" for k in kinds):
        y_train, y_test = (_targets(y, f"{where}: {k}") for y, k in ((y_train, "y_train"), (y_test, "y_test")))
        if y_train.shape[1] != y_test.shape[1]:
            raise TrainserveError(
                f"{where}: y_train has {y_train.shape[1]} targets but y_test has {y_test.shape[1]}: expected equal"
            )
        if label_names:
            raise TrainserveError(f"{where}: label_names given for float labels (regression): expected none")
        return y_train, y_test, Task("regression", targets=int(y_train.shape[1]))
    bad, other = ("y_train", "y_test") if kinds[0] not in "biuf" or kinds[1] in "biu" else ("y_test", "y_train")
    y = y_train if bad == "y_train" else y_test
    raise TrainserveError(
        f"{where}: {bad} has dtype {y.dtype} and shape {y.shape}: expected 1-D integer labels (classification) "
        f"or float labels [N] / [N, T] (regression), of the same kind as {other}"
    )


def _targets(y: np.ndarray, what: str) -> np.ndarray:
    if y.ndim not in (1, 2):
        raise TrainserveError(f"{what} has shape {y.shape}: expected float labels [N] or [N, T] (regression)")
    if not np.all(np.isfinite(y)):
        raise TrainserveError(f"{what} holds NaN or infinite values: expected finite regression targets")
    return (y[:, np.newaxis] if y.ndim == 1 else y).astype(np.float32)


def as_labels(y: np.ndarray, what: str) -> np.ndarray:
    """1-D int64 labels >= 0 ([N, 1] is flattened); anything else is an error naming `what`."""
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1 or not (np.issubdtype(y.dtype, np.integer) or y.dtype == np.bool_):
        raise TrainserveError(f"{what} has dtype {y.dtype} and shape {y.shape}: expected 1-D integer labels")
    if y.min(initial=0) < 0:
        raise TrainserveError(f"{what} has negative labels: labels must be integers >= 0")
    return y.astype(np.int64)
