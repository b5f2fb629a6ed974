"""Which unlabelled examples a version has answered: a set of 64-bit example keys in numpy arrays (8 bytes a key,
where a Python set of ints takes about 60), so that a retry of a request that never gets a label is a duplicate,
as a retry of a labelled one is.

Keys are kept in one sorted array and a small set of those added since its last merge; the set is merged in when it
outgrows a fraction of the sorted part, so each key is moved a logarithmic number of times and memory stays near
8 bytes a key."""

from __future__ import annotations

import numpy as np

MIN_TAIL = 4096  # keys held unsorted before the first merge
TAIL_SHARE = 8  # merge when the tail holds more than 1/TAIL_SHARE of the sorted keys


class SeenKeys:
    def __init__(self) -> None:
        self._sorted = np.zeros(0, np.uint64)
        self._recent: set[int] = set()

    def __len__(self) -> int:
        return len(self._sorted) + len(self._recent)

    def seen(self, keys: np.ndarray) -> np.ndarray:
        """Whether each of `keys` was added before."""
        recent = np.fromiter((int(k) in self._recent for k in keys), bool, len(keys))
        return _member(self._sorted, keys) | recent

    def add(self, keys: np.ndarray) -> None:
        self._recent.update(int(k) for k in keys)
        if len(self._recent) > max(MIN_TAIL, len(self._sorted) // TAIL_SHARE):
            merged = np.fromiter(self._recent, np.uint64, len(self._recent))
            self._sorted = np.union1d(self._sorted, merged)
            self._recent = set()


def _member(sorted_keys: np.ndarray, keys: np.ndarray) -> np.ndarray:
    if not len(sorted_keys):
        return np.zeros(len(keys), bool)
    at = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
    return sorted_keys[at] == keys
