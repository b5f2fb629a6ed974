"""A held-out split of image files, kept as files and content-addressed like the array splits (splits.py).

    <data_dir>/<model>/splits/<fingerprint>/<class>/<file>   written once, never replaced
    <data_dir>/<model>/test/<class>/<file>                   the newest training's split

Files, not decoded pixels: the eval client reads the folder and sends each file's bytes, as any client would,
so what is judged is the served graph's own decoding. The fingerprint hashes each file's class, name and bytes
in the order an image folder is read, so eval can fingerprint a folder it was given and compare. Nothing but
the images is written into the folder (any client may list it); its provenance is in the version's record.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np

from trainserve.files import write_file_atomic
from trainserve.splits import SPLITS, fingerprint_folder, split_record

NEWEST_FOLDER = "test"


class ImageHeldOutSplit:
    """One training's held-out image files: `files[i]` is of class `class_names[labels[i]]`."""

    def __init__(self, files: np.ndarray, labels: np.ndarray, class_names: list[str], origin: dict):
        self.entries = [
            (class_names[label], f"{index:06d}-{Path(path).name}", Path(path))
            for index, (path, label) in enumerate(zip(files, labels))
        ]
        self.provenance = origin
        self.examples = len(self.entries)
        self.fingerprint: str | None = None  # known once the folder is written (share)

    def file(self) -> str:
        return f"{SPLITS}/{self.fingerprint}"

    def record(self, shared: bool) -> dict:
        return split_record(self, shared)

    def share(self, data_dir: Path, model: str) -> Path:
        """Write the folder, fingerprint it, and keep it under `splits/<fingerprint>` (unless that exists: the
        same files) and as the newest `test/`. Returns the content-addressed folder."""
        base = Path(data_dir) / model
        staging = self._write(base / f".{NEWEST_FOLDER}-{os.getpid()}")
        self.fingerprint = fingerprint_folder(staging)
        kept = base / self.file()
        if not kept.is_dir():
            partial = kept.with_name(f".{kept.name}-{os.getpid()}")
            shutil.copytree(staging, partial)
            try:
                os.replace(partial, kept)
            except OSError:  # another training wrote the same files meanwhile
                shutil.rmtree(partial)
        shutil.rmtree(base / NEWEST_FOLDER, ignore_errors=True)
        os.replace(staging, base / NEWEST_FOLDER)
        return kept

    def _write(self, folder: Path) -> Path:
        shutil.rmtree(folder, ignore_errors=True)
        for class_name, name, source in self.entries:
            write_file_atomic(folder / class_name / name, source.read_bytes())
        return folder
