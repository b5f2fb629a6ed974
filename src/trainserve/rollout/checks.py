"""What promote checks of an eval report before it moves `stable`: each check re-derives a fact from the
report's evidence and the files on disk, never from the report's say-so.

    gates     the gates and the data check, judged again from the report's numbers (trainserve.evidence.decision)
    baseline  the comparison was against the config's current `stable` (none only while no `stable` exists)
    files     the version's files on disk are the files the report evaluated (their SHA-256, from its record)
    evidence  the data was the version's own held-out split, verified, and the baseline never trained on it
    partial   the whole split was evaluated (no --limit, no lone --shard)
    server    the report came from the server promote waits on (when --server is given)
    replay    with --replay: the candidate, replayed against stable on all the captured traffic, keeps its flip
              rate's bound within --max-flip-rate, judged again from the replay's flip matrix

A check that refuses is a one-line error naming what was expected; `--override CHECK --reason TEXT` lets it
pass, and the history keeps which checks were overridden and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainserve.evidence.decision import DISJOINT, OWN_SPLIT, decide
from trainserve.evidence.document import ReadReport
from trainserve.evidence.flips import replay_failures
from trainserve.layout import version_files_sha256
from trainserve.rollout.config import PromoteConfig
from trainserve.rollout.labels import Rollout


@dataclass(frozen=True)
class Refusal:
    check: str  # a name of trainserve.rollout.config.CHECKS: what --override names
    said: str


def refusals(
    read: ReadReport, config: PromoteConfig, base_path: str, current: Rollout, replay: ReadReport | None = None
) -> list[Refusal]:
    """Every check the reports fail, in the order a person should fix them."""
    report = read.report
    found = [
        *_gates(report),
        *_baseline(report, current),
        *_files(report, Path(base_path) / str(report["version"])),
        *_evidence(report),
        *_partial(report),
        *_server(report, config.server),
    ]
    said = [Refusal(check, f"eval report {read.path}: {words}") for check, words in found]
    if replay is not None:
        said += [
            Refusal("replay", f"replay report {replay.path}: {words}")
            for words in _replay(replay.report, report, current)
        ]
    return said


def _gates(report: dict) -> list[tuple[str, str]]:
    failures = decide(report).failures
    if not failures:
        return []
    more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
    return [("gates", f"version {report['version']} did not pass: {failures[0]}{more}")]


def _baseline(report: dict, current: Rollout) -> list[tuple[str, str]]:
    if current.stable is None:
        return []
    comparison = report.get("comparison")
    if comparison is None:
        said = "compared with no version"
    else:
        compared = comparison["baseline"]["version"]
        if compared == current.stable:
            return []
        said = "found no baseline (first rollout)" if compared is None else f"compared with version {compared}"
    return [
        (
            "baseline",
            f"it {said}, but stable is version {current.stable}: expected eval --compare-with stable, run since "
            "stable last moved",
        )
    ]


def _files(report: dict, version_dir: Path) -> list[tuple[str, str]]:
    recorded = ((report.get("evidence") or {}).get("version") or {}).get("files_sha256")
    if recorded is None:
        return [("files", "it names no SHA-256 of the version's files: expected eval with --data-dir (its record)")]
    on_disk = version_files_sha256(version_dir)
    if on_disk == recorded:
        return []
    return [
        (
            "files",
            f"the files of version {report['version']} under {version_dir.parent} are not the ones it evaluated "
            f"(SHA-256 {on_disk[:12]}, evaluated {recorded[:12]}; published again?): expected a new eval",
        )
    ]


def _evidence(report: dict) -> list[tuple[str, str]]:
    evidence = report.get("evidence") or {}
    kind = evidence.get("kind")
    if kind != OWN_SPLIT:
        said = evidence.get("said") or "the report states no evidence"
        return [
            (
                "evidence",
                f"its evidence is {kind or 'unknown'} ({said}): expected the version's own held-out split, verified "
                "(eval --data-dir DIR --data held-out)",
            )
        ]
    baseline = evidence.get("baseline") or {}
    if baseline.get("version") is not None and baseline.get("rows") != DISJOINT:
        return [("evidence", f"its comparison may be biased: {baseline.get('said')}")]
    return []


def _partial(report: dict) -> list[tuple[str, str]]:
    evidence = report.get("evidence") or {}
    if evidence.get("partial") is False:
        return []
    examples, whole = evidence.get("examples"), evidence.get("split_examples")
    settings = report.get("settings") or {}
    how = ", ".join(f"--{k} {settings[k]}" for k in ("limit", "shard") if settings.get(k) is not None)
    return [
        (
            "partial",
            f"it evaluated {examples} of {whole if whole is not None else 'an unknown number of'} examples"
            f"{f' ({how})' if how else ''}: expected the whole split (shards: trainserve report merge)",
        )
    ]


def _server(report: dict, server: str | None) -> list[tuple[str, str]]:
    if server is None or report.get("server") == server:
        return []
    return [("server", f"it was made on {report.get('server')}, not on {server}: expected an eval of this server")]


def _replay(replay: dict, report: dict, current: Rollout) -> list[str]:
    """The replay judged the candidate of the eval report against today's stable, on all its captured traffic,
    and its flip-rate gate holds on its own counts."""
    candidate, baseline = replay["candidate"]["version"], replay["baseline"]["version"]
    if replay["model"] != report["model"] or candidate != report["version"]:
        return [
            f"it replayed model {replay['model']} version {candidate}, not the candidate: expected a replay of "
            f"model {report['model']} version {report['version']}"
        ]
    if current.stable is not None and baseline != current.stable:
        return [
            f"it compared with version {baseline}, but stable is version {current.stable}: expected a replay "
            "--compare-with stable"
        ]
    limit, shard = replay["settings"].get("limit"), replay["capture"]["shard"]
    if limit is not None or shard is not None:
        how = f"--limit {limit}" if limit is not None else f"--shard {shard}"
        return [f"it replayed part of the capture ({how}): expected all of it (shards: trainserve replay-merge)"]
    return replay_failures(replay)
