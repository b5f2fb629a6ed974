"""Where training data comes from, one module per kind: `builtin` (digits, synthetic, the Keras sets),
`npz`, `csv_table` and `image_folder` (a folder of images, one sub-folder per class). `load_dataset` picks
the source from `--data`; every source builds its Dataset with `trainserve.data.build_dataset`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from trainserve.errors import TrainserveError
from trainserve.sources.synthetic import SyntheticSpec

if TYPE_CHECKING:
    from trainserve.data import Dataset, ImageFormat
    from trainserve.hashed_split import HashedSplit


def load_dataset(
    source: str,
    synthetic: SyntheticSpec | None = None,
    seed: int = 0,
    label_column: str | None = None,
    test_fraction: float = 0.2,
    categorical: tuple[str, ...] = (),
    image: ImageFormat | None = None,
    skip_bad_images: bool = False,
    split: HashedSplit | None = None,
) -> Dataset:
    """Load `digits`, `synthetic`, a keras data set name, an `.npz` or a `.csv` file, or a folder of images
    (`image`: the size its images are resized to), validated. `split` holds out the examples of digits, a
    `.csv` or a folder by keyed hash (training always passes one); None draws them with `seed`, as versions
    trained before hashed splits were (their records name no scheme). A file's own x_test, synthetic data
    and the Keras sets keep their fixed splits."""
    from trainserve.sources import builtin

    if os.path.isdir(source):
        from trainserve.data import ImageFormat
        from trainserve.sources.image_folder import load_image_folder

        image = image or ImageFormat(64, 64)
        return load_image_folder(Path(source), image, test_fraction, seed, skip_bad_images, split)
    if source == "digits":
        return builtin.digits(seed, split)
    if source == "synthetic":
        return builtin.synthetic(synthetic or SyntheticSpec(), seed)
    if source in builtin.KERAS_DATASETS:
        return builtin.keras_dataset(source)
    if source.endswith(".csv"):
        from trainserve.sources.csv_table import load_csv

        return load_csv(Path(source), label_column, test_fraction, seed, categorical, split)
    if categorical:
        raise TrainserveError(f"--categorical applies to a --data FILE.csv: expected none with --data {source}")
    if source.endswith(".npz") or os.path.sep in source:
        from trainserve.sources.npz import load_npz

        return load_npz(Path(source))
    raise TrainserveError(
        f"unknown data source {source!r}: expected digits, synthetic, {', '.join(builtin.KERAS_DATASETS)}, "
        "a FILE.npz, a FILE.csv or a DIR/ of images (one sub-folder per class)"
    )
