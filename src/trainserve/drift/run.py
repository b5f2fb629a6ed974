"""`trainserve drift`: each captured request's inputs counted into the training bins of the version that answered
it, then compared feature by feature (stats.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from trainserve.data_profile import add_counts, count_traffic, profile_path
from trainserve.drift.config import DriftConfig
from trainserve.drift.stats import compare
from trainserve.errors import TrainserveError
from trainserve.tensors import from_tensor_proto
from trainserve.traffic.reader import ReadSummary, read_capture


@dataclass
class VersionTraffic:
    """One answering version's captured traffic, counted into its training bins."""

    version: int
    profile: dict
    records: int = 0
    examples: int = 0
    counts: dict = field(default_factory=dict)
    uncompared: set = field(default_factory=set)  # inputs the training profile has no feature for


def load_profile(data_dir: Path, model: str, version: int) -> dict:
    path = profile_path(data_dir, model, version)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise TrainserveError(
            f"no data profile for model {model!r} version {version} ({path}): expected `trainserve train "
            f"--data-dir {data_dir}` to have written it (versions trained before profiles and image folders have none)"
        ) from None
    except (OSError, ValueError) as exc:
        raise TrainserveError(f"data profile {path} is unreadable ({exc}): expected trainserve train's JSON") from None


def count_capture(config: DriftConfig, captures: list[Path]) -> tuple[dict[int, VersionTraffic], ReadSummary]:
    """Every record of the model, counted per answering version."""
    config.check()
    summary = ReadSummary()
    versions: dict[int, VersionTraffic] = {}
    for n, record in enumerate(read_capture(captures, config.model, config.shard, summary)):
        if config.limit is not None and n >= config.limit:
            break
        side = versions.get(record.version)
        if side is None:
            side = versions[record.version] = VersionTraffic(
                record.version, load_profile(config.data_dir, config.model, record.version)
            )
        inputs = {k: from_tensor_proto(v) for k, v in record.request.inputs.items()}
        counted = count_traffic(side.profile, inputs)
        side.uncompared.update(k for k in inputs if not any(_of_input(f, k) for f in counted))
        add_counts(side.counts, counted)
        side.records += 1
        first = next(iter(inputs.values()), None)
        side.examples += 0 if first is None else len(first) if first.ndim else 1
    return versions, summary


def _of_input(feature: str, name: str) -> bool:
    return feature == name or feature.startswith((f"{name}[", f"{name}."))


def compare_version(side: VersionTraffic) -> list[dict]:
    """The version's features, most drifted first (by PSI, then unseen share)."""
    rows = [compare(name, side.profile["features"][name], counted) for name, counted in side.counts.items()]
    return sorted(rows, key=lambda r: (-r["psi"], -(r["unseen_share"] or 0), r["feature"]))
