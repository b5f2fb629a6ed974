"""Each version's held-out split, kept where a later training cannot overwrite it, and the record that ties it
to the version (shared by training, which writes both, and evaluation, which reads them without TensorFlow).

    <data_dir>/<model>/splits/<fingerprint>.npz    a held-out split, content-addressed: written once, never replaced
    <data_dir>/<model>/test.npz                    the newest training's split (as before, for existing users)
    <data_dir>/<model>/versions/<version>.json     what eval needs of a version: its split, task, class names

The fingerprint is a SHA-256 over the split's arrays (name, dtype, shape, bytes; not the zip's timestamps), so
the same rows give the same fingerprint whichever process wrote them, and an eval client can check that the
data it was given is the data the version was held out from. Beside the arrays a split carries its
`provenance` (source, seed, fraction and, since splits are hashed, the hash scheme: trainserve.hashed_split) and
each held-out row's content digest (`row_digests`), so eval can count the rows of this split that any other
version, whose record names its own salt and fraction, could have trained on. Versions trained before splits
were hashed drew them with --seed: two such splits of one source with different seeds share rows.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from pathlib import Path

import numpy as np

from trainserve.errors import TrainserveError
from trainserve.files import write_file_atomic
from trainserve.hashed_split import DIGESTS, HashedSplit
from trainserve.layout import split_arrays
from trainserve.sources.image_folder import list_images

PROVENANCE_KEY = "provenance"  # a 0-d JSON string in the split, outside the fingerprint
SPLITS, VERSIONS, NEWEST = "splits", "versions", "test.npz"
DIGITS_TEST_FRACTION = 0.2  # trainserve.data._digits' held-out share
# Sources whose held-out rows come from one pool: by keyed hash now (the salt and fraction decide them), drawn
# with --seed by versions trained before. (A file's own x_test, keras' fixed splits and synthetic draws hold
# out the same rows, or disjoint ones, whatever the seed.)
SEEDED_SOURCES = ("digits", ".csv")
_CHUNK = 1 << 20


def provenance(source: str, seed: int, test_fraction: float, hashed: dict | None = None) -> dict:
    """Where a training's held-out rows came from, enough to know whether another split overlaps them;
    `hashed`: the keyed-hash scheme that chose them (trainserve.hashed_split), None for a fixed split."""
    origin = _origin(source, seed, test_fraction)
    return {**origin, "test_fraction": test_fraction, "split": hashed} if hashed else origin


def _origin(source: str, seed: int, test_fraction: float) -> dict:
    if source == "digits":
        return {"source": source, "seed": seed, "test_fraction": DIGITS_TEST_FRACTION}
    if source.endswith(".csv"):  # the rows depend on the file's content, the seed and the fraction
        digest = file_sha256(Path(source))
        return {"source": Path(source).name, "source_sha256": digest, "seed": seed, "test_fraction": test_fraction}
    if Path(source).is_dir():  # an image folder: the files held out depend on its files, the seed and the fraction
        fingerprint = fingerprint_folder(Path(source))
        name = Path(source).name
        return {"source": name, "source_fingerprint": fingerprint, "seed": seed, "test_fraction": test_fraction}
    return {"source": source, "seed": seed}


def fingerprint_folder(root: Path) -> str:
    """SHA-256 over every image file's class, name and bytes, in folder-reading order."""
    digest = hashlib.sha256()
    files, names, _ = list_images(root)
    for path, label in files:
        digest.update(json.dumps([names[label], path.name, path.stat().st_size]).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes, streamed."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def is_training_source(version: dict | None, data_path: Path) -> bool:
    """True when `data_path` is the very CSV file or image folder the version's rows were drawn from."""
    if not version:
        return False
    if version.get("source_sha256") and data_path.is_file():
        return file_sha256(data_path) == version["source_sha256"]
    if version.get("source_fingerprint") and data_path.is_dir():
        return fingerprint_folder(data_path) == version["source_fingerprint"]
    return False


def known_overlap(version: dict | None, data: dict | None) -> bool | None:
    """True when the data's held-out rows were drawn from the pool the version trained on with another seed (or
    fraction); False when both name the same draw; None when it cannot be known."""
    if not version or not data or version.get("source") != data.get("source"):
        return None
    content = ("source_sha256", "source_fingerprint")
    seeded = str(version["source"]).endswith(SEEDED_SOURCES) or any(version.get(k) for k in content)
    if not seeded or any(version.get(k) != data.get(k) for k in content):
        return None
    return not _same_draw(version, data)


def _same_draw(version: dict, data: dict) -> bool:
    """Both hashed alike (seed aside: it no longer draws the split), or both drawn with one seed and fraction."""
    schemes = HashedSplit.from_json(version.get("split")), HashedSplit.from_json(data.get("split"))
    if schemes != (None, None):
        return schemes[0] == schemes[1]
    return all(version.get(k) == data.get(k) for k in ("seed", "test_fraction"))


def _hash_member(digest, name: str, dtype: np.dtype, shape: tuple, chunks) -> None:
    digest.update(json.dumps([name, dtype.str, list(shape)]).encode())
    for chunk in chunks:
        digest.update(chunk)


def fingerprint_arrays(arrays: dict[str, np.ndarray]) -> str:
    """SHA-256 of a split's arrays (the provenance aside), in name order."""
    digest = hashlib.sha256()
    for name in sorted(k for k in arrays if k != PROVENANCE_KEY):
        array = np.asarray(arrays[name], order="C")  # (ascontiguousarray would make a 0-d array 1-d)
        _hash_member(digest, name, array.dtype, array.shape, [array.tobytes()])
    return digest.hexdigest()


def fingerprint_npz(path: Path) -> str:
    """The same SHA-256, streamed from an .npz's members (a large file is never loaded whole)."""
    digest = hashlib.sha256()
    with zipfile.ZipFile(path) as archive:
        members = sorted(m for m in archive.namelist() if m.endswith(".npy") and m[:-4] != PROVENANCE_KEY)
        for member in members:
            with archive.open(member) as fh:
                version = np.lib.format.read_magic(fh)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                shape, fortran, dtype = read(fh)
                if fortran or dtype.hasobject:  # not streamable row by row: hash it as it loads
                    with np.load(path, allow_pickle=False) as npz:
                        array = np.asarray(npz[member[:-4]], order="C")
                    _hash_member(digest, member[:-4], array.dtype, array.shape, [array.tobytes()])
                    continue
                _hash_member(digest, member[:-4], dtype, shape, iter(lambda fh=fh: fh.read(_CHUNK), b""))
    return digest.hexdigest()


def read_provenance(path: Path) -> dict | None:
    """The provenance a split file carries, or None (a file trainserve did not write, or an older one)."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            return json.loads(str(npz[PROVENANCE_KEY][()])) if PROVENANCE_KEY in npz.files else None
    except (OSError, ValueError, zipfile.BadZipFile):
        return None


def split_record(split, shared: bool) -> dict:
    """trainserve.json's `data.test_split` of a held-out split (`file`: None when it was not shared)."""
    return {
        "fingerprint": split.fingerprint,
        "file": split.file() if shared else None,
        "examples": split.examples,
        "provenance": split.provenance,
    }


class HeldOutSplit:
    """One training's held-out split, in memory: its arrays (with each row's digest, where hashed),
    fingerprint and provenance."""

    def __init__(self, inputs: dict, labels: np.ndarray, task, single: bool, origin: dict, digests=None):
        self.arrays = split_arrays(inputs, labels, task, single)
        if digests is not None:  # a hashed split: each row's content digest, for eval's overlap count
            self.arrays[DIGESTS] = np.asarray(digests)
        self.fingerprint = fingerprint_arrays(self.arrays)
        self.provenance = origin
        self.examples = len(labels)

    def file(self) -> str:
        """Where it lives, relative to `<data_dir>/<model>`."""
        return f"{SPLITS}/{self.fingerprint}.npz"

    def record(self, shared: bool) -> dict:
        return split_record(self, shared)

    def share(self, data_dir: Path, model: str) -> Path:
        """Write `splits/<fingerprint>.npz` unless it exists (same fingerprint, same rows), then the newest
        `test.npz`; both atomically. Returns the content-addressed file."""
        buffer = io.BytesIO()
        np.savez(buffer, **self.arrays, **{PROVENANCE_KEY: np.array(json.dumps(self.provenance, sort_keys=True))})
        base = Path(data_dir) / model
        path = base / self.file()
        if not path.is_file():
            write_file_atomic(path, buffer.getvalue())
        write_file_atomic(base / NEWEST, buffer.getvalue())
        return path


def version_record_path(data_dir: Path, model: str, version: int) -> Path:
    return Path(data_dir) / model / VERSIONS / f"{version}.json"


def write_version_record(data_dir: Path, model: str, version: int, metadata: dict, files_sha256: str) -> Path:
    """`versions/<version>.json`: the part of trainserve.json an eval client needs, on the data volume it
    already mounts (it never needs the models volume, nor TensorFlow), and the SHA-256 of the published
    version's files (trainserve.layout.version_files_sha256), which eval copies into its report for promote."""
    keys = ("model_name", "task", "label_names", "data", "signature", "created")
    record = {k: metadata[k] for k in keys if k in metadata}
    record.update(version=version, test_split=metadata["data"]["test_split"], files_sha256=files_sha256)
    return write_file_atomic(
        version_record_path(data_dir, model, version), (json.dumps(record, indent=2) + "\n").encode()
    )


def read_version_record(data_dir: Path | None, model: str, version: int) -> dict | None:
    """A version's record, or None where none was written (no --data-dir, a model trainserve did not train)."""
    if data_dir is None:
        return None
    path = version_record_path(data_dir, model, version)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise TrainserveError(
            f"version record {path} is unreadable ({exc}): expected trainserve train's JSON"
        ) from None
