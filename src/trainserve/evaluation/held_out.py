"""Which data judges the served version: its own held-out split, checked against the version's record.

The version is resolved first (through the server: a label or "newest" names a number only there), then its
record is read from the data directory (`<data-dir>/<model>/versions/<version>.json`, written by training):
`--data held-out` (the default wherever a record is found) opens the split the record names, refused if its
content no longer matches its content address; `--data digits` holds out what the version's record says (its
hash scheme; or its seed, for a version trained before splits were hashed); any other data is fingerprinted
and compared. The check says which evidence the data is:
`own-split` (verified against the record), `overlapping` (rows the version trained on: the same source held out
under another salt or fraction, or another seed before splits were hashed, or the very CSV file or image folder
it trained on; every gate then fails) or `unverified`
(no record, or data that cannot be matched to it), which promote refuses without an explicit override.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

from trainserve.errors import TrainserveError
from trainserve.evaluation.config import EvalConfig
from trainserve.evaluation.data import EvalData, open_eval_data
from trainserve.evidence.decision import OVERLAPPING, OWN_SPLIT, UNVERIFIED
from trainserve.hashed_split import HashedSplit
from trainserve.splits import (
    DIGITS_TEST_FRACTION,
    fingerprint_folder,
    fingerprint_npz,
    is_training_source,
    known_overlap,
    provenance,
    read_provenance,
    read_version_record,
    version_record_path,
)

log = logging.getLogger(__name__)
HELD_OUT, AUTO = "held-out", "auto"


@dataclass(frozen=True)
class DataCheck:
    """The data against the version's record: `matches` and `overlap` are None where it cannot be known."""

    version_fingerprint: str | None
    data_fingerprint: str | None
    matches: bool | None
    overlap: bool | None
    note: str

    @property
    def kind(self) -> str:
        """The evidence this data is for the version: own-split, overlapping or unverified."""
        if self.overlap:
            return OVERLAPPING
        return OWN_SPLIT if self.matches and self.overlap is False else UNVERIFIED

    def to_json(self) -> dict:
        return {
            "version_fingerprint": self.version_fingerprint,
            "data_fingerprint": self.data_fingerprint,
            "matches": self.matches,
            "overlaps_training": self.overlap,
            "note": self.note,
        }


def open_for_version(config: EvalConfig, version: int) -> tuple[EvalData, DataCheck, dict | None]:
    """The data to evaluate `version` on, its check against the version's record, and the record."""
    record = read_version_record(config.data_dir, config.model, version)
    split = (record or {}).get("test_split") or {}
    where = f"model {config.model!r} version {version}"
    source = config.data
    if source == AUTO:  # the defaults follow the data: the version's own split wherever its record is found
        source = HELD_OUT if split.get("file") else "digits"
        log.info("--data %s: %s", source, "the version's own held-out split" if split.get("file") else "no record")
    if source == HELD_OUT:
        data, check = _open_held_out(config, version, split, where)
    elif source == "digits":
        seed, hashed = _digits_draw(split.get("provenance"), where)
        data = _open("digits", config, seed, hashed)
        fraction = hashed.test_fraction if hashed else DIGITS_TEST_FRACTION
        digits = provenance("digits", seed, fraction, hashed.to_json() if hashed else None)
        check = _check(split, _digits_fingerprint(seed, hashed), digits, where)
    elif split and (source.endswith(".npz") or Path(source).is_dir()):
        data = _open(source, config)
        check = _check(split, *_fingerprint_split(Path(source)), where, Path(source))
    else:
        data = _open(source, config)
        check = _check(split, None, None, where, Path(source))
    return data, check, record


def _open_held_out(config: EvalConfig, version: int, split: dict, where: str) -> tuple[EvalData, DataCheck]:
    """The split the record names, refused when its content is no longer what its name says."""
    if not split.get("file"):
        path = version_record_path(config.data_dir or Path("."), config.model, version)
        raise TrainserveError(
            f"--data held-out: no held-out split recorded for {where} ({path}): expected a version that "
            "`trainserve train --data-dir` published there, or --data FILE"
        )
    path = Path(config.data_dir) / config.model / split["file"]
    fingerprint, origin = _fingerprint_split(path)
    if fingerprint != split.get("fingerprint"):
        raise TrainserveError(
            f"held-out split {path} of {where} was changed after training (its content hashes to "
            f"{fingerprint[:12]}, its record says {str(split.get('fingerprint'))[:12]}): expected the split as "
            "training wrote it"
        )
    data = replace(_open(str(path), config), name=f"held-out split of version {version}")
    return data, _check(split, fingerprint, origin, where)


def _fingerprint_split(path: Path) -> tuple[str, dict | None]:
    """A split's fingerprint and provenance: an .npz of arrays, or a folder of image files per class (whose
    provenance only the version's record holds)."""
    if path.is_dir():
        return fingerprint_folder(path), None
    return fingerprint_npz(path), read_provenance(path)


def _open(source: str, config: EvalConfig, seed: int = 0, hashed: HashedSplit | None = None) -> EvalData:
    return open_eval_data(source, config.limit, config.synthetic, config.label_column, seed, hashed)


def _digits_draw(recorded: dict | None, where: str) -> tuple[int, HashedSplit | None]:
    """How the version's digits split was chosen: its hash scheme (or, before splits were hashed, its seed);
    refused when it trained on other data."""
    if recorded is None:
        log.warning(
            "no record of %s's held-out split: evaluating the seed-0 digits split, which may hold rows it trained "
            "on; the report says `unverified` and promote refuses it (expected --data-dir)",
            where,
        )
        return 0, None
    if recorded.get("source") != "digits":
        raise TrainserveError(
            f"--data digits: {where} was trained on {recorded.get('source')!r}, not digits: expected --data held-out "
            "(its own split) or its data file"
        )
    return int(recorded["seed"]), HashedSplit.from_json(recorded.get("split"))


def _digits_fingerprint(seed: int, hashed: HashedSplit | None) -> str:
    from trainserve.sources import load_dataset
    from trainserve.splits import HeldOutSplit

    ds = load_dataset("digits", seed=seed, split=hashed)
    return HeldOutSplit(ds.test, ds.y_test, ds.task, ds.single, {}, ds.test_digests).fingerprint


def _check(
    split: dict, fingerprint: str | None, data_origin: dict | None, where: str, data_path: Path | None = None
) -> DataCheck:
    recorded, trained_on = split.get("fingerprint"), split.get("provenance")
    if data_path is not None and is_training_source(trained_on, data_path):
        note = f"{data_path.name} is the very data {where} was trained on (its held-out rows are a part of it)"
        log.warning("the data is refused: %s", note)
        return DataCheck(recorded, fingerprint, False, True, note)
    if recorded is None:
        return DataCheck(None, fingerprint, None, None, f"no record of {where}'s held-out split")
    if fingerprint is None:
        return DataCheck(recorded, None, None, None, "the data cannot be fingerprinted (not a split file)")
    if fingerprint == recorded:
        return DataCheck(recorded, fingerprint, True, False, f"the held-out split {where} was trained beside")
    overlap = known_overlap(trained_on, data_origin)
    note = f"not the held-out split of {where} (fingerprint {fingerprint[:12]}, recorded {recorded[:12]})"
    if overlap:
        note += (
            ": held out from the same source another way (salt, fraction or seed), so it holds rows the version"
            " trained on"
        )
    elif overlap is False:  # the same draw with other rows: edited since, so what it holds is unknown
        overlap = None
        note += ": drawn as that split was, but its rows differ (edited after training?)"
    log.warning("the data is %s", note)
    return DataCheck(recorded, fingerprint, False, overlap, note)
