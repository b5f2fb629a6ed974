"""Which side of the split an example is on, as a function of the example itself (as TFX ExampleGen's hash
buckets): a keyed hash of its content, never a random draw.

    digest  = SHA-256 of the example's content (a CSV row's cells as read, by column name; an image file's
              bytes; an array row's bytes with its label), or of one key column's value (`--split-key id`)
    bucket  = first 8 bytes of SHA-256(salt, 0x00, digest), big-endian, mod `buckets`
    held out  when bucket < held_out_buckets (round(test_fraction x buckets))

So a row keeps its side whatever rows are added, removed or reordered around it, and whatever `--seed` is;
the salt (by default derived from the model name) makes one model's split independent of another's. Each
held-out row's unsalted digest is kept in the split file, so eval can place it under any other version's salt
and fraction and count the rows that version could have trained on, without the raw values. Duplicated rows
share a digest, so they land on the same side: a duplicate never leaks across.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainserve.errors import TrainserveError

SCHEME = "sha256-buckets-v1"
BUCKETS = 10_000
DIGESTS = "row_digests"  # a split .npz's member: each held-out row's content digest, S32 [N]
DIGEST_DTYPE = np.dtype("S32")


def default_salt(model_name: str) -> str:
    """The salt a model's split gets unless --split-salt says otherwise: the same in any fresh directory."""
    return f"model:{model_name}"


@dataclass(frozen=True)
class HashedSplit:
    """A split by keyed hash: `salt`, `test_fraction` of `buckets`, over `key`'s value (None: the whole row)."""

    salt: str
    test_fraction: float
    key: str | None = None
    buckets: int = BUCKETS

    @property
    def held_out_buckets(self) -> int:
        return int(round(self.test_fraction * self.buckets))

    def held_out(self, digests: np.ndarray | Sequence[bytes]) -> np.ndarray:
        """A bool mask: True where the example with this digest is held out."""
        salt = self.salt.encode() + b"\x00"
        # Whole 32-byte rows: numpy's S32 items drop trailing zero bytes, which would change the hash.
        rows = np.ascontiguousarray(np.asarray(digests, DIGEST_DTYPE)).view(np.uint8).reshape(-1, 32)
        buckets = [int.from_bytes(hashlib.sha256(salt + row.tobytes()).digest()[:8], "big") for row in rows]
        return np.asarray(buckets, np.uint64) % np.uint64(self.buckets) < self.held_out_buckets

    def to_json(self) -> dict:
        return {
            "scheme": SCHEME,
            "salt": self.salt,
            "buckets": self.buckets,
            "held_out_buckets": self.held_out_buckets,
            "test_fraction": self.test_fraction,
            "key": self.key,
        }

    @classmethod
    def from_json(cls, raw: dict | None) -> HashedSplit | None:
        """The scheme a version's record names, or None: a version trained before splits were hashed (or on a
        source with a fixed split), whose rows cannot be placed."""
        if not raw or raw.get("scheme") != SCHEME:
            return None
        return cls(str(raw["salt"]), float(raw["test_fraction"]), raw.get("key"), int(raw["buckets"]))


def split_by_digest(
    digests: np.ndarray, split: HashedSplit, where: str, classes: tuple[np.ndarray, Sequence[str]] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(training indexes, held-out indexes), each in the data's order; refused when a side is empty, or when a
    class of `classes` (labels, names) would have no example to train on."""
    held = split.held_out(digests)
    if held.all() or not held.any():
        raise TrainserveError(
            f"{where}: --test-fraction {split.test_fraction} under split salt {split.salt!r} puts all"
            f" {len(held)} examples on one side: expected more examples (or another --split-salt)"
        )
    if classes is not None:
        labels, names = classes
        only_held = sorted(set(labels[held].tolist()) - set(labels[~held].tolist()))
        if only_held:
            name = names[only_held[0]] if only_held[0] < len(names) else str(only_held[0])
            raise TrainserveError(
                f"{where}: class {name!r} has all its {int(np.sum(labels == only_held[0]))} example(s) held out"
                f" (--test-fraction {split.test_fraction}, each example placed by its hash): expected more examples"
                " of it, or another --split-salt"
            )
    return np.flatnonzero(~held), np.flatnonzero(held)


def _sha256(*parts: bytes) -> bytes:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
    return digest.digest()


def csv_row_digests(header: Sequence[str], body: Sequence[Sequence[str]], key: str | None) -> np.ndarray:
    """Each row's digest: its cells by column name (column order does not matter), or its `key` cell alone."""
    if key is not None:
        column = list(header).index(key)
        return np.array([_sha256(row[column].encode()) for row in body], DIGEST_DTYPE)
    order = sorted(range(len(header)), key=lambda i: header[i])
    names = [header[i] for i in order]
    return np.array([_sha256(json.dumps([names, [row[i] for i in order]]).encode()) for row in body], DIGEST_DTYPE)


def file_digests(paths: Iterable[str | Path]) -> np.ndarray:
    """Each file's digest: the SHA-256 of its bytes (name and folder aside: a renamed file keeps its side)."""
    return np.array([_sha256(Path(p).read_bytes()) for p in paths], DIGEST_DTYPE)


def array_row_digests(inputs: dict[str, np.ndarray], labels: np.ndarray) -> np.ndarray:
    """Each example's digest: every input's row (name, dtype, shape, bytes, in name order), then its label."""
    columns = [(name, np.ascontiguousarray(inputs[name])) for name in sorted(inputs)]
    columns.append(("label", np.ascontiguousarray(labels)))
    heads = [json.dumps([name, a.dtype.str, list(a.shape[1:])]).encode() for name, a in columns]

    def digest(i: int) -> bytes:
        return _sha256(*(part for (_, a), head in zip(columns, heads) for part in (head, a[i].tobytes())))

    return np.array([digest(i) for i in range(len(labels))], DIGEST_DTYPE)


def class_fractions(labels: np.ndarray, held_out: np.ndarray, names: Sequence[str]) -> dict[str, float]:
    """Each class's held-out share (the hash stratifies only approximately), rounded for the record."""
    return {
        str(name): round(float(held_out[labels == index].mean()), 4)
        for index, name in enumerate(names)
        if np.any(labels == index)
    }


def describe_split(record: dict) -> str:
    """One line for the training log: how the held-out examples were chosen, and how near each class came to
    the fraction (the hash does not stratify exactly)."""
    shares = ", ".join(f"{name} {share:.2f}" for name, share in (record.get("class_fractions") or {}).items())
    key = f", key column {record['key']!r}" if record.get("key") else ""
    return (
        f"held out by keyed hash (salt {record['salt']!r}, {record['held_out_buckets']} of {record['buckets']}"
        f" buckets{key}): the same examples in every training of this model, whatever --seed"
        + (f"; held-out share per class: {shares}" if shares else "")
    )
