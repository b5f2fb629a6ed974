"""The report's `evidence`: what the evaluation proves, in the fields promote checks.

kind       own-split (the version's held-out split, verified against its record) | unverified | overlapping
partial    part of the data was evaluated (--limit, a --shard not yet merged, fewer examples than the split)
version    the SHA-256 of the version's files and its creation time, as its record names them: promote
           recomputes the first from the files on disk, so a report vouches for those files only
baseline   the version compared with, and whether the rows of the comparison are ones it trained on:
           disjoint (its record's split is this split, or another draw of a source that holds out the same
           rows), overlapping (another seed's draw of the same pool: it has seen most of them, which flatters
           it; every comparison gate then fails), unknown (no record of it)
"""

from __future__ import annotations

import logging

from trainserve.evaluation.config import EvalConfig
from trainserve.evaluation.held_out import DataCheck
from trainserve.evidence.decision import DISJOINT, OVERLAPPING, UNKNOWN
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


def baseline_evidence(config: EvalConfig, version: int | None, record: dict | None, first_rollout: str | None) -> dict:
    """What is known of the baseline: its version (None: a first rollout, `first_rollout` says how that is known)
    and whether it trained on the rows of this comparison."""
    section = {"reference": config.compare_with, "version": version, "rows": None, "said": first_rollout}
    if version is None:
        return section
    rows, said = _baseline_rows(config, version, record)
    if rows != DISJOINT:
        log.warning("baseline version %d: %s", version, said)
    return {**section, "rows": rows, "said": said}


def _baseline_rows(config: EvalConfig, version: int, record: dict | None) -> tuple[str, str]:
    theirs = read_version_record(config.data_dir, config.model, version)
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
    return UNKNOWN, f"version {version} trained on other data ({their_split.get('provenance')}): overlap unknown"
