"""Which data judges the served version: its own held-out split, checked against the version's record.

The version is resolved first (through the server: a label or "newest" names a number only there), then its
record is read from the data directory (`<data-dir>/<model>/versions/<version>.json`, written by training):
`--data held-out` opens the split the record names; `--data digits` draws the split with the seed the version
trained with; any other data is fingerprinted and compared. A different split is a warning and
`data_matches_version: false`; one known to hold rows the version trained on (same source, another seed) makes
every gate fail: a version scored on its own training rows looks better than it is.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

from trainserve.errors import TrainserveError
from trainserve.evaluation.config import EvalConfig
from trainserve.evaluation.data import EvalData, open_eval_data
from trainserve.image_splits import fingerprint_folder
from trainserve.splits import (
    DIGITS_TEST_FRACTION,
    fingerprint_arrays,
    fingerprint_npz,
    known_overlap,
    provenance,
    read_provenance,
    read_version_record,
    version_record_path,
)

log = logging.getLogger(__name__)
HELD_OUT = "held-out"


@dataclass(frozen=True)
class DataCheck:
    """The data against the version's record: `matches` and `overlap` are None where it cannot be known."""

    version_fingerprint: str | None
    data_fingerprint: str | None
    matches: bool | None
    overlap: bool | None
    note: str

    def to_json(self) -> dict:
        return {
            "version_fingerprint": self.version_fingerprint,
            "data_fingerprint": self.data_fingerprint,
            "matches": self.matches,
            "overlaps_training": self.overlap,
            "note": self.note,
        }


def open_for_version(config: EvalConfig, version: int) -> tuple[EvalData, DataCheck]:
    """The data to evaluate `version` on, and its check against the version's record."""
    record = read_version_record(config.data_dir, config.model, version)
    split = (record or {}).get("test_split") or {}
    recorded = split.get("provenance")
    where = f"model {config.model!r} version {version}"
    if config.data == HELD_OUT:
        if not split.get("file"):
            path = version_record_path(config.data_dir or Path("."), config.model, version)
            raise TrainserveError(
                f"--data held-out: no held-out split recorded for {where} ({path}): expected a version that "
                "`trainserve train --data-dir` published there, or --data FILE"
            )
        path = Path(config.data_dir) / config.model / split["file"]
        data = replace(_open(str(path), config), name=f"held-out split of version {version}")
        return data, _check(split, *_fingerprint_split(path), where)
    if config.data == "digits":
        seed = _digits_seed(recorded, where)
        data = _open("digits", config, seed)
        return data, _check(split, _digits_fingerprint(seed), provenance("digits", seed, DIGITS_TEST_FRACTION), where)
    if split and (config.data.endswith(".npz") or Path(config.data).is_dir()):
        data = _open(config.data, config)
        return data, _check(split, *_fingerprint_split(Path(config.data)), where)
    data = _open(config.data, config)
    return data, _check(split, None, None, where)


def _fingerprint_split(path: Path) -> tuple[str, dict | None]:
    """A split's fingerprint and provenance: an .npz of arrays, or a folder of image files per class (whose
    provenance only the version's record holds)."""
    if path.is_dir():
        return fingerprint_folder(path), None
    return fingerprint_npz(path), read_provenance(path)


def _open(source: str, config: EvalConfig, seed: int = 0) -> EvalData:
    return open_eval_data(source, config.limit, config.synthetic, config.label_column, seed)


def _digits_seed(recorded: dict | None, where: str) -> int:
    """The seed the version's digits split was drawn with; refused when it trained on other data."""
    if recorded is None:
        log.warning("no record of %s's held-out split: evaluating the seed-0 digits split, unchecked", where)
        return 0
    if recorded.get("source") != "digits":
        raise TrainserveError(
            f"--data digits: {where} was trained on {recorded.get('source')!r}, not digits: expected --data held-out "
            "(its own split) or its data file"
        )
    return int(recorded["seed"])


def _digits_fingerprint(seed: int) -> str:
    from trainserve.layout import split_arrays
    from trainserve.sources import load_dataset

    ds = load_dataset("digits", seed=seed)
    return fingerprint_arrays(split_arrays(ds.test, ds.y_test, ds.task, ds.single))


def _check(split: dict, fingerprint: str | None, data_origin: dict | None, where: str) -> DataCheck:
    recorded = split.get("fingerprint")
    if recorded is None:
        return DataCheck(None, fingerprint, None, None, f"no record of {where}'s held-out split")
    if fingerprint is None:
        return DataCheck(recorded, None, None, None, "the data cannot be fingerprinted (not a split file)")
    if fingerprint == recorded:
        return DataCheck(recorded, fingerprint, True, False, f"the held-out split {where} was trained beside")
    overlap = known_overlap(split.get("provenance"), data_origin)
    note = f"not the held-out split of {where} (fingerprint {fingerprint[:12]}, recorded {recorded[:12]})"
    if overlap:
        note += ": drawn from the same source with another seed, so it holds rows the version trained on"
    log.warning("the data is %s", note)
    return DataCheck(recorded, fingerprint, False, overlap, note)
