"""The data sets that need no file: `digits` (bundled with scikit-learn), `synthetic` (generated) and the
Keras sets (`mnist`, `fashion_mnist`, `cifar10`, downloaded through Keras' cache). Each is uint8 `images`."""

from __future__ import annotations

import numpy as np

from trainserve.data import IMAGES, Dataset, build_dataset
from trainserve.errors import TrainserveError
from trainserve.hashed_split import HashedSplit, array_row_digests, split_by_digest
from trainserve.sources.synthetic import SyntheticSpec, synthetic_examples

KERAS_DATASETS = ("mnist", "fashion_mnist", "cifar10")
CIFAR10_LABELS = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
FASHION_LABELS = ["t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "boot"]


def digits(seed: int, split: HashedSplit | None = None) -> Dataset:
    """scikit-learn's 1,797 digits (no fixed split upstream): held out by `split`'s keyed hash of each image
    and label, or (None: a version trained before hashed splits) a stratified 20 % drawn with `seed`."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bundled = load_digits()
    # 8x8 images with values 0..16: scale to the uint8 range real image data uses.
    images = np.round(bundled.images * (255.0 / 16.0)).astype(np.uint8)[..., np.newaxis]
    labels = bundled.target.astype(np.int64)
    names = [str(i) for i in range(10)]
    if split is None:
        x_train, x_test, y_train, y_test = train_test_split(
            images, labels, test_size=0.2, random_state=seed, stratify=labels
        )
        return build_dataset("digits", x_train, y_train, x_test, y_test, names)
    digests = array_row_digests({IMAGES: images}, labels)  # as the split's arrays hold them: eval digests alike
    train, test = split_by_digest(digests, split, "digits", (labels, names))
    dataset = build_dataset("digits", images[train], labels[train], images[test], labels[test], names)
    return dataset.with_hashed_split(split, labels, test, digests)


def synthetic(spec: SyntheticSpec, seed: int) -> Dataset:
    if spec.classes < 2 or spec.size < 2 or min(spec.shape) < 1:
        raise TrainserveError(f"synthetic data {spec}: expected >= 2 classes, >= 2 examples, positive shape")
    n_test = max(1, spec.size // 5)
    x_train, y_train = synthetic_examples(spec, spec.size - n_test, seed)
    x_test, y_test = synthetic_examples(spec, n_test, seed + 1)
    return build_dataset("synthetic", x_train, y_train, x_test, y_test, [str(i) for i in range(spec.classes)])


def keras_dataset(name: str) -> Dataset:
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
