"""The report's `evidence`: what the evaluation proves, in the fields promote checks.

kind       own-split (the version's held-out split, verified against its record) | unverified | overlapping
partial    part of the data was evaluated (--limit, a --shard not yet merged, fewer examples than the split)
version    the SHA-256 of the version's files and its creation time, as its record names them: promote
           recomputes the first from the files on disk, so a report vouches for those files only
baseline   the version compared with, and whether the rows of the comparison are ones it trained on. For a
           baseline whose split was hashed (trainserve.hashed_split), counted: each evaluated row is placed
           under the baseline's salt, fraction and key; `disjoint` when none falls on its training side
           (`rows_checked` says how many were placed), `overlapping` with `rows_overlapping`, the exact number
           that does (rows it could have trained on; every comparison gate then fails). For a version trained
           before splits were hashed: disjoint (its record's split is this split, or the same draw),
           overlapping (another seed's draw of the same pool), unknown (no record, or other data)
"""

from __future__ import annotations

import logging

from trainserve.evaluation.config import EvalConfig
from trainserve.evaluation.data import EvalData
from trainserve.evaluation.held_out import DataCheck
from trainserve.evidence.decision import DISJOINT, OVERLAPPING, UNKNOWN
from trainserve.hashed_split import HashedSplit
from trainserve.splits import known_overlap, read_version_record

log = logging.getLogger(__name__)


def evidence_section(config: EvalConfig, check: DataCheck, record: dict | None, examples: int, baseline: dict | None):
    """The report's `evidence` for `examples` evaluated examples, with `baseline_evidence`'s result, if any."""
    split_examples = ((record or {}).get("test_split") or {}).get("examples")
    partial = config.limit is not None or config.shard is not None
    partial = partial or (split_examples is not None and check.matches is True and examples < split_examples)
    return {
        "kind": check.kind,
        "said": check.note,
        "examples": examples,
        "split_examples": split_examples,
        "partial": partial,
        "version": {"files_sha256": (record or {}).get("files_sha256"), "created": (record or {}).get("created")},
        "baseline": baseline,
    }


def baseline_evidence(
    config: EvalConfig, version: int | None, record: dict | None, first_rollout: str | None, data: EvalData
) -> dict:
    """What is known of the baseline: its version (None: a first rollout, `first_rollout` says how that is known)
    and whether it trained on the rows of this comparison (`data`: the rows evaluated)."""
    section = {"reference": config.compare_with, "version": version, "rows": None, "said": first_rollout}
    if version is None:
        return section
    theirs = read_version_record(config.data_dir, config.model, version)
    counted = _count_overlap(version, theirs, data)
    rows, said = counted[:2] if counted else _baseline_rows(version, theirs, record)
    if rows != DISJOINT:
        log.warning("baseline version %d: %s", version, said)
    else:
        log.info("baseline version %d: %s", version, said)
    section = {**section, "rows": rows, "said": said}
    return {**section, "rows_checked": counted[2], "rows_overlapping": counted[3]} if counted else section


def _count_overlap(version: int, theirs: dict | None, data: EvalData) -> tuple[str, str, int, int] | None:
    """(rows, said, rows checked, rows on the baseline's training side), counted from the evaluated rows' own
    digests; None when the baseline's split was not hashed or the rows' digests cannot be known."""
    scheme = HashedSplit.from_json((((theirs or {}).get("test_split") or {}).get("provenance") or {}).get("split"))
    digests = data.row_digests(scheme.key) if scheme else None
    if scheme is None or digests is None:
        return None
    checked, overlapping = len(digests), int((~scheme.held_out(digests)).sum())
    placed = f"under its split (salt {scheme.salt!r}, {scheme.held_out_buckets} of {scheme.buckets} buckets held out)"
    if overlapping == 0:
        return DISJOINT, f"version {version} held out all {checked} rows checked, {placed}", checked, 0
    said = (
        f"{overlapping} of the {checked} rows checked fall on version {version}'s training side {placed}: it may"
        " have trained on them, which biases the comparison in its favour"
    )
    return OVERLAPPING, said, checked, overlapping


def _baseline_rows(version: int, theirs: dict | None, record: dict | None) -> tuple[str, str]:
    """A baseline trained before splits were hashed: known only from the two records' provenance."""
    if theirs is None or record is None:
        missing = version if theirs is None else "the evaluated version"
        return UNKNOWN, f"no record of {missing}'s split: whether the baseline trained on these rows is unknown"
    mine, their_split = record.get("test_split") or {}, theirs.get("test_split") or {}
    if mine.get("fingerprint") and mine.get("fingerprint") == their_split.get("fingerprint"):
        return DISJOINT, f"version {version} held out these same rows"
    overlap = known_overlap(their_split.get("provenance"), mine.get("provenance"))
    if overlap:
        return OVERLAPPING, (
            f"version {version} was trained on another draw of the same data, so it has seen most of these rows: "
            "the comparison is biased in its favour"
        )
    if overlap is False:
        return DISJOINT, f"version {version} held out these same rows (the same draw)"
    return UNKNOWN, (
        f"version {version} trained on other data ({their_split.get('provenance')}), or before splits were hashed:"
        " overlap unknown (retrain it once to count it: docs/evidence.md)"
    )
