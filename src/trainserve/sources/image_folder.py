"""`--data DIR/`: a folder of images, one sub-folder per class, as people keep them.

    DIR/<class>/<file>      class names: the sub-folders' names, sorted (any UTF-8 name; dot-folders skipped),
                            as keras.utils.image_dataset_from_directory orders them
                            files: .jpg .jpeg .png .bmp .gif in any case, found recursively; others skipped
                            and counted

Every image is decoded once while scanning (the same TensorFlow decoder training uses), so a truncated or
non-image file stops the run before training, naming it, unless `--skip-bad-images`. The data set holds the
files' paths, not pixels: training streams them through tf.data (training/images.py decodes them, and the
exported model decodes served bytes with the same function). The held-out files are those a keyed hash of
their bytes places there (trainserve.hashed_split: a file keeps its side when others are added, whatever the
seed); they are kept as files for the eval client (image_splits.py).
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trainserve.data import Dataset, ImageFormat, build_dataset
from trainserve.errors import TrainserveError
from trainserve.hashed_split import DIGEST_DTYPE, HashedSplit, split_by_digest

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".bmp", ".gif", ".jpeg", ".jpg", ".png")  # image_dataset_from_directory's ALLOWLIST_FORMATS
IMAGE_BYTES = "image_bytes"  # the served input: encoded image files, DT_STRING [N]


@dataclass
class FolderScan:
    """The images found: paths (str [N]), class ids, class names; what was skipped, and why."""

    paths: np.ndarray
    labels: np.ndarray
    class_names: list[str]
    digest: str  # sha256 over every file's class and bytes, in order
    file_digests: np.ndarray  # each kept file's own sha256 (S32): what a hashed split places it by
    other_files: int = 0  # files without an image extension
    bad: list[str] = field(default_factory=list)  # image files that do not decode (kept out with --skip-bad-images)


def class_folders(root: Path) -> list[str]:
    """The class names: sub-folder names, sorted, dot-folders skipped."""
    if not root.is_dir():
        raise TrainserveError(f"{root} is not a directory: expected DIR/<class>/<image files>")
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def list_images(root: Path) -> tuple[list[tuple[Path, int]], list[str], int]:
    """((path, class id) per image file, class names, count of other files), each class's files sorted."""
    names = class_folders(root)
    files: list[tuple[Path, int]] = []
    other = sum(1 for p in root.iterdir() if p.is_file())  # files beside the class folders belong to none
    for index, name in enumerate(names):
        found = []
        for folder, dirs, filenames in os.walk(root / name, followlinks=True):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for filename in filenames:
                path = Path(folder) / filename
                if path.suffix.lower() in IMAGE_EXTENSIONS:
                    found.append(path)
                else:
                    other += 1
        files += [(path, index) for path in sorted(found)]
    return files, names, other


def scan_image_folder(root: Path, skip_bad: bool = False) -> FolderScan:
    """List, check and decode every image under `root` (a progress bar on a terminal)."""
    files, names, other = list_images(root)
    counts = np.bincount([label for _, label in files], minlength=len(names))
    if len(names) < 2:
        raise TrainserveError(
            f"{root} has {len(names)} class folder(s): expected DIR/<class>/<images> for >= 2 classes"
        )
    empty = [name for name, count in zip(names, counts) if count == 0]
    if empty:
        raise TrainserveError(
            f"{root}: class folder {empty[0]!r}{f' and {len(empty) - 1} more' if len(empty) > 1 else ''} holds no"
            f" image: expected {', '.join(IMAGE_EXTENSIONS)} files in every class folder"
        )
    digest = hashlib.sha256()
    bad, each = [], []
    for (path, label), problem in zip(files, _decode_all([p for p, _ in files], root)):
        if problem is not None:
            bad.append(str(path))
            continue
        content = path.read_bytes()
        digest.update(f"{label}:{path.relative_to(root)}:".encode())
        digest.update(content)
        each.append(hashlib.sha256(content).digest())
    if bad and not skip_bad:
        more = f" (and {len(bad) - 1} other image file(s) that do not decode)" if len(bad) > 1 else ""
        raise TrainserveError(
            f"{bad[0]} is not a decodable image{more}: expected JPEG, PNG, BMP or GIF files"
            " (--skip-bad-images leaves them out)"
        )
    left_out = set(bad)
    kept = [(p, label) for p, label in files if str(p) not in left_out]
    if other:
        log.info("%s: %d file(s) without an image extension skipped", root, other)
    if bad:
        log.warning("%s: %d image file(s) that do not decode left out: %s", root, len(bad), ", ".join(bad))
    paths = np.array([str(p) for p, _ in kept], dtype=str)
    labels = np.array([label for _, label in kept], np.int64)
    return FolderScan(paths, labels, names, digest.hexdigest(), np.array(each, DIGEST_DTYPE), other, bad)


def _decode_all(paths: list[Path], root: Path) -> list[str | None]:
    """Decode each file with TensorFlow's decoder (threads: the op releases the GIL); None where it decodes."""
    import tensorflow as tf

    def check(path: Path) -> str | None:
        try:
            tf.io.decode_image(tf.io.read_file(str(path)), expand_animations=False)
            return None
        except (tf.errors.InvalidArgumentError, tf.errors.OutOfRangeError, tf.errors.UnknownError) as exc:
            return exc.message.splitlines()[0] if exc.message else type(exc).__name__

    problems: list[str | None] = []
    bar = _ProgressBar(f"scanning {root}", len(paths))
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        for problem in pool.map(check, paths):
            problems.append(problem)
            bar.advance()
    bar.close()
    return problems


class _ProgressBar:
    """`scanning DIR: 1234/5000 images` on one terminal line, redrawn at most every 1%; silent off a terminal."""

    def __init__(self, label: str, total: int):
        self.label, self.total, self.done, self.shown = label, total, 0, -1
        self.live = sys.stderr.isatty()

    def advance(self) -> None:
        self.done += 1
        percent = self.done * 100 // max(self.total, 1)
        if self.live and percent != self.shown:
            self.shown = percent
            sys.stderr.write(f"\r{self.label}: {self.done}/{self.total} images ({percent}%)")
            sys.stderr.flush()

    def close(self) -> None:
        if self.live:
            sys.stderr.write("\n")


def held_out_per_class(labels: np.ndarray, fraction: float, seed: int, where: Path) -> tuple[np.ndarray, np.ndarray]:
    """(training indexes, test indexes): `fraction` of each class (at least one), drawn with `seed`."""
    rng = np.random.default_rng(seed)
    test = []
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        n_test = max(1, int(round(len(members) * fraction)))
        if n_test >= len(members):
            raise TrainserveError(
                f"{where}: a class has {len(members)} image(s): expected at least 2 per class (one to train on,"
                f" one held out by --test-fraction {fraction})"
            )
        test += rng.choice(members, n_test, replace=False).tolist()
    test_mask = np.zeros(len(labels), bool)
    test_mask[test] = True
    return np.flatnonzero(~test_mask), np.flatnonzero(test_mask)


def load_image_folder(
    root: Path, image: ImageFormat, test_fraction: float, seed: int, skip_bad: bool, split: HashedSplit | None = None
) -> Dataset:
    """The folder as a data set of file paths (`image_bytes`): held out by each file's keyed hash (`split`), or
    (None: a version trained before hashed splits) a `test_fraction` of each class drawn with `seed`."""
    scan = scan_image_folder(root, skip_bad)
    if split is None:
        train, test = held_out_per_class(scan.labels, test_fraction, seed, root)
    else:
        # Refused when a class would have no image to train on; each class's held-out share goes to the record.
        train, test = split_by_digest(scan.file_digests, split, str(root), (scan.labels, scan.class_names))
    dataset = build_dataset(
        root.name or str(root),
        {IMAGE_BYTES: scan.paths[train]},
        scan.labels[train],
        {IMAGE_BYTES: scan.paths[test]},
        scan.labels[test],
        scan.class_names,
        str(root),
        image=image,
    )
    dataset.content_digest = scan.digest
    dataset.skipped = {"other_files": scan.other_files, "bad_images": scan.bad}
    return dataset if split is None else dataset.with_hashed_split(split, scan.labels, test, scan.file_digests)


def read_files(paths: np.ndarray) -> np.ndarray:
    """The files' bytes as an object array (what a DT_STRING tensor holds)."""
    return np.array([Path(p).read_bytes() for p in paths] or [], dtype=object)
