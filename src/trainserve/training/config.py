"""`trainserve train`'s options, declared once: type, default and help. The CLI is derived from them.

Kept free of TensorFlow so that `trainserve train --help` answers at once.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from trainserve.data import ImageFormat
from trainserve.errors import TrainserveError
from trainserve.options import choices_of, option, positive_int
from trainserve.sources.synthetic import SyntheticSpec

if TYPE_CHECKING:
    from trainserve.hashed_split import HashedSplit
    from trainserve.training.publish import Retention

Architecture = Literal["auto", "cnn", "mlp", "mobilenet_v3_small", "efficientnet_b0", "resnet50"]
Weights = str  # imagenet | none | FILE.weights.h5
Strategy = Literal["auto", "default", "one-device", "mirrored", "multi-worker"]
MixedPrecision = Literal["auto", "on", "off"]

ARCHITECTURES: tuple[str, ...] = choices_of(Architecture)
STRATEGIES: tuple[str, ...] = choices_of(Strategy)
MIXED_PRECISION_MODES: tuple[str, ...] = choices_of(MixedPrecision)


def image_size(text: str) -> tuple[int, int]:
    """`32,32` (or `32x32`) -> (32, 32)."""
    try:
        dims = tuple(int(d) for d in text.lower().replace("x", ",").split(","))
    except ValueError:
        dims = ()
    if len(dims) != 2 or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected H,W such as 64,64")
    return dims  # type: ignore[return-value]


def seconds(text: str) -> float:
    """A duration in seconds, > 0 and finite."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of seconds > 0")
    return value


def column_names(text: str) -> tuple[str, ...]:
    """`a,b` -> ("a", "b")."""
    return tuple(name.strip() for name in text.split(",") if name.strip())


@dataclass
class TrainConfig:
    """Everything `trainserve train` takes; each field is the flag of the same name."""

    model_name: str = option("digits", "name of the served model (directory under --export-base)")
    export_base: Path = option(Path("models"), "model base directory (/models in images)")
    data: str = option(
        "digits",
        "digits (bundled, offline) | synthetic | mnist | fashion_mnist | cifar10 | FILE.npz "
        "(x_train y_train x_test y_test, or x_train/<input> x_test/<input>) | FILE.csv (with --label-column) | "
        "DIR/ of images, one sub-folder per class (.jpg .jpeg .png .bmp .gif)",
    )
    label_column: str | None = option(None, "the label column of a --data FILE.csv; the other columns are inputs")
    categorical: tuple[str, ...] = option(
        (),
        "COL[,COL..]: columns of a --data FILE.csv that are categories though they hold numbers (ids)",
        parse=column_names,
    )
    test_fraction: float = option(
        0.2,
        "held-out fraction of digits, a --data FILE.csv or DIR/: each example's side is a keyed hash of its content"
        " (or --split-key), so it keeps its side as rows are added and whatever --seed is",
        parse=float,
    )
    split_key: str | None = option(
        None, "a column of a --data FILE.csv whose value alone places each row (an id): edits elsewhere keep its side"
    )
    split_salt: str | None = option(
        None, "the held-out split's hash salt (default: model:<--model-name>, the same in any fresh directory)"
    )
    image_size: tuple[int, int] | None = option(
        None,
        "H,W the images of a --data DIR/ are resized to (aspect not kept); default 64,64, or 224,224 for a"
        " transfer --architecture",
        parse=image_size,
    )
    augment: tuple[str, ...] = option(
        (), "flip,rotate,zoom,contrast: random augmentation of --data DIR/ images, in training only", parse=column_names
    )
    cache: str = option("", "cache the decoded images of a --data DIR/: memory, or a FILE (default: none, streamed)")
    skip_bad_images: bool = option(False, "leave out image files that do not decode (listed in the run summary)")
    validation_split: float = option(
        0.1, "fraction of the training data held back for per-epoch metrics (0: none)", parse=float
    )
    data_dir: Path | None = option(Path("data"), "where the held-out split is shared")
    logs_dir: Path = option(Path("logs"), "CSV, TensorBoard, curves PNG, summary")
    backup_dir: Path | None = option(None, "resume a killed run from its last finished epoch")
    architecture: Architecture = option(
        "auto",
        "the built-in network to train (unless --model-fn); auto: cnn for images, mlp for tables and [N, F] arrays;"
        " mobilenet_v3_small | efficientnet_b0 | resnet50: a Keras Applications backbone with a new head",
    )
    weights: Weights = option("imagenet", "a transfer --architecture's backbone: imagenet | none | FILE.weights.h5")
    frozen_epochs: int = option(2, "epochs a transfer backbone stays frozen before it is fine-tuned", parse=int)
    fine_tune_learning_rate: float | None = option(
        None, "learning rate once a transfer backbone is unfrozen (default: --learning-rate / 10)", parse=float
    )
    model_fn: str | None = option(
        None, "your own model: path/to/file.py:function or package.module:function (docs/how-to/own-model.md)"
    )
    epochs: int = option(10, "epochs to train", parse=positive_int)
    batch_size: int = option(64, "per-replica batch size", parse=positive_int)
    # 3e-3, not Keras' 1e-3: the default CNN on the bundled digits (1,298 training images, 20 steps an epoch)
    # reaches 0.93-0.95 held-out accuracy in 5 epochs instead of 0.85-0.91 (seeds 0-3), same model.
    learning_rate: float = option(3e-3, "Adam learning rate")
    grad_accum: int = option(1, "accumulate gradients over K steps", parse=positive_int)
    strategy: Strategy = option("auto", "tf.distribute; auto: multi-worker under TF_CONFIG, mirrored with several GPUs")
    cpu_replicas: int = option(1, "split the CPU into N logical devices", parse=positive_int)
    heartbeat_timeout: float | None = option(
        None,
        "multi-worker: seconds without a worker's heartbeat before the others count it lost (default: TensorFlow's"
        " 10 s)",
        parse=seconds,
        metavar="SECONDS",
    )
    mixed_precision: MixedPrecision = option("auto", "auto: on for GPUs >= 7.0")
    keep: int | None = option(
        None,
        "keep only the newest N versions (never the new one, nor one --serving-config names)",
        parse=positive_int,
    )
    serving_config: Path | None = option(
        None,
        "the ModelServerConfig text proto serving reads (compose: /rollout/models.config): with --keep, a version "
        "its labels (stable, previous, candidate...) or version policy name is never deleted",
    )
    seed: int = option(
        0, "random seed: initialisation, shuffling and the --validation-split draw (never the held-out split)"
    )
    warmup_from: Path | None = option(
        None,
        "a capture (directory or file of PredictionLog TFRecords): the version's warmup requests are this model's "
        "captured requests its signature takes (up to 1000) instead of held-out examples",
    )
    synthetic: SyntheticSpec = option(factory=SyntheticSpec)

    def check(self) -> None:
        for name in ("epochs", "batch_size", "grad_accum", "cpu_replicas"):
            if getattr(self, name) < 1:
                raise TrainserveError(f"--{name.replace('_', '-')} {getattr(self, name)}: expected >= 1")
        if self.keep is not None and self.keep < 1:
            raise TrainserveError(f"--keep {self.keep}: expected >= 1 (the new version is always kept)")
        if not self.model_name or not all(c.isalnum() or c in "-_." for c in self.model_name):
            raise TrainserveError(f"--model-name {self.model_name!r}: expected letters, digits, '-', '_' or '.'")
        if not 0 <= self.validation_split < 1 or not 0 < self.test_fraction < 1:
            raise TrainserveError(
                f"--validation-split {self.validation_split} / --test-fraction {self.test_fraction}:"
                " expected 0 <= validation split < 1 and 0 < test fraction < 1"
            )
        if self.split_key is not None and not self.data.endswith(".csv"):
            raise TrainserveError(f"--split-key applies to a --data FILE.csv: expected none with --data {self.data}")
        if self.split_salt == "":
            raise TrainserveError("--split-salt is empty: expected a non-empty salt (or leave it out)")
        if self.architecture not in ARCHITECTURES:
            raise TrainserveError(f"--architecture {self.architecture!r}: expected one of {', '.join(ARCHITECTURES)}")
        if self.frozen_epochs < 0:
            raise TrainserveError(f"--frozen-epochs {self.frozen_epochs}: expected >= 0")
        from trainserve.training.images import check_augmentations

        check_augmentations(self.augment)
        if self.retention and self.serving_config is not None:
            from trainserve.training.publish import versions_in_use

            try:  # unreadable: an error now, not after training
                versions_in_use(self.serving_config, self.model_name)
            except TrainserveError as exc:
                raise TrainserveError(f"--serving-config: {exc}") from None

    @property
    def held_out_split(self) -> HashedSplit:
        """How the held-out examples of digits, a CSV or an image folder are chosen (fixed splits ignore it)."""
        from trainserve.hashed_split import HashedSplit, default_salt

        salt = self.split_salt if self.split_salt is not None else default_salt(self.model_name)
        return HashedSplit(salt, self.test_fraction, self.split_key)

    @property
    def retention(self) -> Retention | None:
        """What publishing prunes after it (nothing without --keep)."""
        from trainserve.training.publish import Retention

        return Retention(self.keep, self.serving_config) if self.keep else None

    @property
    def image_format(self) -> ImageFormat:
        """The size images are decoded to: --image-size, else the chosen architecture's default."""
        from trainserve.training.transfer import TRANSFER_SIZES

        height, width = self.image_size or TRANSFER_SIZES.get(self.architecture, (64, 64))
        return ImageFormat(height, width, 3)

    @property
    def model_reference(self) -> str:
        """The model function to call: --model-fn, or the built-in --architecture's."""
        return self.model_fn or self.architecture
