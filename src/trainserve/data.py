"""Data sets: load, validate, fingerprint and share the held-out split (training and evaluation both).

Every source ends up as uint8 images `[N, H, W, C]` and int64 labels in `[0, K)`. Scaling to float
happens in the training graph and the serving signature (`trainserve.training.pipeline.preprocess`).
"""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trainserve.errors import TrainserveError
from trainserve.layout import write_file_atomic
from trainserve.options import image_shape, option, positive_int

KERAS_DATASETS = ("mnist", "fashion_mnist", "cifar10")
NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")
CIFAR10_LABELS = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
FASHION_LABELS = ["t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "boot"]


@dataclass(frozen=True)
class SyntheticSpec:
    """Shape of `--data synthetic`: learnable class templates plus noise, for load and speed runs."""

    shape: tuple[int, int, int] = option((28, 28, 1), "H,W,C of --data synthetic", parse=image_shape)
    classes: int = option(10, "classes of --data synthetic", parse=positive_int)
    size: int = option(10000, "examples of --data synthetic", parse=positive_int)


@dataclass
class Dataset:
    """A train/test split of uint8 NHWC images with integer labels."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    label_names: list[str] = field(default_factory=list)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return tuple(int(d) for d in self.x_train.shape[1:])  # type: ignore[return-value]

    @property
    def num_classes(self) -> int:
        return len(self.label_names)

    def fingerprint(self) -> str:
        """sha256 over all four arrays: names exactly which data a model was trained and tested on."""
        digest = hashlib.sha256()
        for array in (self.x_train, self.y_train, self.x_test, self.y_test):
            digest.update(str((array.dtype.str, array.shape)).encode())
            digest.update(np.ascontiguousarray(array).tobytes())
        return digest.hexdigest()


def load_dataset(source: str, synthetic: SyntheticSpec | None = None, seed: int = 0) -> Dataset:
    """Load `digits`, `synthetic`, a keras data set name, or an `.npz` file, validated."""
    if source == "digits":
        return _digits(seed)
    if source == "synthetic":
        return _synthetic(synthetic or SyntheticSpec(), seed)
    if source in KERAS_DATASETS:
        return _keras_dataset(source)
    if source.endswith(".npz") or os.path.sep in source:
        return load_npz(Path(source))
    raise TrainserveError(
        f"unknown data source {source!r}: expected digits, synthetic, {', '.join(KERAS_DATASETS)} or a FILE.npz"
    )


def load_npz(path: Path, keys: tuple[str, ...] = NPZ_KEYS) -> Dataset:
    """Read an npz holding `x_train y_train x_test y_test` (or the subset named by `keys`)."""
    if not path.is_file():
        raise TrainserveError(f"data file {path} not found: expected an .npz with keys {', '.join(keys)}")
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [k for k in keys if k not in npz.files]
            if missing:
                raise TrainserveError(
                    f"data file {path} lacks {', '.join(missing)}: expected keys {', '.join(keys)}"
                    f" (found {', '.join(npz.files) or 'none'})"
                )
            arrays = {k: npz[k] for k in keys}
            names = [str(n) for n in npz["label_names"]] if "label_names" in npz.files else []
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise TrainserveError(f"data file {path} is not a readable .npz ({exc})") from None
    empty = np.zeros((0, 1, 1, 1), np.uint8)
    return build_dataset(
        path.stem,
        arrays.get("x_train", empty),
        arrays.get("y_train", np.zeros(0, np.int64)),
        arrays["x_test"],
        arrays["y_test"],
        names,
        source=str(path),
    )


def build_dataset(
    name: str,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    label_names: list[str] | None = None,
    source: str = "",
) -> Dataset:
    """Check shapes, dtypes and labels; add the channel axis to HxW images."""
    where = source or name
    x_train, x_test = (_as_nhwc(x, f"{where}: {k}") for x, k in ((x_train, "x_train"), (x_test, "x_test")))
    y_train, y_test = (as_labels(y, f"{where}: {k}") for y, k in ((y_train, "y_train"), (y_test, "y_test")))
    for x, y, split in ((x_train, y_train, "train"), (x_test, y_test, "test")):
        if len(x) != len(y):
            raise TrainserveError(
                f"{where}: x_{split} has {len(x)} examples but y_{split} has {len(y)}: expected equal lengths"
            )
    if len(x_train) and x_train.shape[1:] != x_test.shape[1:]:
        raise TrainserveError(
            f"{where}: x_train images are {x_train.shape[1:]} but x_test images are {x_test.shape[1:]}:"
            " expected one image shape"
        )
    if not len(x_test):
        raise TrainserveError(f"{where}: x_test is empty: expected at least one held-out example")
    observed = int(max(y_train.max(initial=0), y_test.max(initial=0))) + 1
    names = list(label_names or [str(i) for i in range(int(y_train.max(initial=0)) + 1)])
    if observed > len(names):
        raise TrainserveError(
            f"{where}: label {observed - 1} is out of range: expected labels in [0, {len(names)})"
            " (the classes seen in y_train, or label_names)"
        )
    return Dataset(name, x_train, y_train, x_test, y_test, names)


def _as_nhwc(x: np.ndarray, what: str) -> np.ndarray:
    if x.dtype != np.uint8:
        raise TrainserveError(f"{what} has dtype {x.dtype}: expected uint8 images (0-255)")
    if x.ndim == 3:
        return x[..., np.newaxis]
    if x.ndim != 4:
        raise TrainserveError(f"{what} has shape {x.shape}: expected [N, H, W] or [N, H, W, C] images")
    return x


def as_labels(y: np.ndarray, what: str) -> np.ndarray:
    """1-D int64 labels >= 0 ([N, 1] is flattened); anything else is an error naming `what`."""
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise TrainserveError(f"{what} has dtype {y.dtype} and shape {y.shape}: expected 1-D integer labels")
    if y.min(initial=0) < 0:
        raise TrainserveError(f"{what} has negative labels: labels must be integers >= 0")
    return y.astype(np.int64)


def _digits(seed: int) -> Dataset:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    # 8x8 images with values 0..16: scale to the uint8 range real image data uses.
    images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)
    labels = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=0.2, random_state=seed, stratify=labels
    )
    return build_dataset("digits", x_train, y_train, x_test, y_test, [str(i) for i in range(10)])


def synthetic_examples(spec: SyntheticSpec, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`count` images drawn around fixed per-class templates: learnable, deterministic per seed.

    Integer noise keeps generation cheap enough for load runs (a client must not be slower than a server).
    """
    templates = np.random.default_rng(1234).integers(0, 256, (spec.classes, *spec.shape), dtype=np.int16)
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, spec.classes, count)
    noise = rng.integers(-80, 81, (count, *spec.shape), dtype=np.int16)
    images = np.clip(templates[labels] + noise, 0, 255).astype(np.uint8)
    return images, labels.astype(np.int64)


def _synthetic(spec: SyntheticSpec, seed: int) -> Dataset:
    if spec.classes < 2 or spec.size < 2 or min(spec.shape) < 1:
        raise TrainserveError(f"synthetic data {spec}: expected >= 2 classes, >= 2 examples, positive shape")
    n_test = max(1, spec.size // 5)
    x_train, y_train = synthetic_examples(spec, spec.size - n_test, seed)
    x_test, y_test = synthetic_examples(spec, n_test, seed + 1)
    return build_dataset("synthetic", x_train, y_train, x_test, y_test, [str(i) for i in range(spec.classes)])


def _keras_dataset(name: str) -> Dataset:
    import keras

    loader = getattr(keras.datasets, name)
    try:
        (x_train, y_train), (x_test, y_test) = loader.load_data()
    except Exception as exc:  # urllib, ssl and http errors all end here when offline
        raise TrainserveError(
            f"could not download keras data set {name!r} ({type(exc).__name__}): offline? "
            "expected network access, or pass --data FILE.npz or --data digits"
        ) from None
    names = {"cifar10": CIFAR10_LABELS, "fashion_mnist": FASHION_LABELS}.get(name, [str(i) for i in range(10)])
    return build_dataset(name, x_train, y_train, x_test, y_test, names)


def write_npz_atomic(path: Path, **arrays: np.ndarray) -> Path:
    """Write an npz so that readers never see half a file (held-out splits are small: built in memory)."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return write_file_atomic(path, buffer.getvalue())


def write_test_split(dataset: Dataset, data_dir: Path, model_name: str) -> Path:
    """Share the held-out split (`<data_dir>/<model>/test.npz`) with the eval client in another container."""
    return write_npz_atomic(
        data_dir / model_name / "test.npz",
        x_test=dataset.x_test,
        y_test=dataset.y_test,
        label_names=np.array(dataset.label_names),
    )
