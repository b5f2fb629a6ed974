"""`trainserve drift`: each captured request's inputs counted into the training bins of the version that answered
it, then compared feature by feature (compare.py). A version without a training profile is left out and named, not
a stop of the whole run: the other versions' traffic is still evidence."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path

from trainserve.data_profile import add_counts, count_traffic, profile_path
from trainserve.drift.compare import compare
from trainserve.drift.config import DriftConfig
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


@dataclass
class Unprofiled:
    """A version whose training profile does not exist: its requests are counted, not compared."""

    version: int
    profile: str
    records: int = 0

    def as_dict(self) -> dict:
        return {"version": self.version, "profile": self.profile, "records": self.records}


@dataclass
class CountedTraffic:
    """What one read of a capture counted: per version compared, per version left out, and what was read."""

    versions: dict[int, VersionTraffic] = field(default_factory=dict)
    unprofiled: dict[int, Unprofiled] = field(default_factory=dict)
    read: ReadSummary = field(default_factory=ReadSummary)

    def side(self, data_dir: Path, model: str, version: int) -> VersionTraffic | Unprofiled:
        """The version's counts, its profile read the first time it is seen."""
        known = self.versions.get(version) or self.unprofiled.get(version)
        if known is not None:
            return known
        profile = load_profile(data_dir, model, version)
        if profile is None:
            side = self.unprofiled[version] = Unprofiled(version, str(profile_path(data_dir, model, version)))
        else:
            side = self.versions[version] = VersionTraffic(version, profile)
        return side

    def check_compared(self, data_dir: Path, model: str) -> None:
        """One error line when no version could be compared: nothing would be a verdict."""
        if self.unprofiled and not self.versions:
            said = ", ".join(f"version {v} ({u.profile})" for v, u in sorted(self.unprofiled.items()))
            raise TrainserveError(
                f"no data profile for model {model!r} {said}: expected `trainserve train --data-dir {data_dir}` to "
                "have written it (versions trained before profiles and image folders have none)"
            )


def load_profile(data_dir: Path, model: str, version: int) -> dict | None:
    """The version's training profile; None when training wrote none."""
    path = profile_path(data_dir, model, version)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise TrainserveError(f"data profile {path} is unreadable ({exc}): expected trainserve train's JSON") from None


def count_capture(config: DriftConfig, captures: list[Path]) -> CountedTraffic:
    """Every record of the model (the first --limit of them), counted per answering version."""
    config.check()
    counted = CountedTraffic()
    records = read_capture(captures, config.model, config.shard, counted.read)
    # islice stops without asking the reader for one more record, so `kept` is the number counted.
    for record in itertools.islice(records, config.limit):
        side = counted.side(config.data_dir, config.model, record.version)
        side.records += 1
        if isinstance(side, VersionTraffic):
            _count_request(side, {k: from_tensor_proto(v) for k, v in record.request.inputs.items()})
    counted.check_compared(config.data_dir, config.model)
    return counted


def _count_request(side: VersionTraffic, inputs: dict) -> None:
    counted = count_traffic(side.profile, inputs)
    side.uncompared.update(k for k in inputs if not any(_of_input(f, k) for f in counted))
    add_counts(side.counts, counted)
    first = next(iter(inputs.values()), None)
    side.examples += 0 if first is None else len(first) if first.ndim else 1


def _of_input(feature: str, name: str) -> bool:
    return feature == name or feature.startswith((f"{name}[", f"{name}."))


def compare_version(side: VersionTraffic) -> list[dict]:
    """The version's features, most drifted first (by PSI, then unseen share)."""
    rows = [compare(name, side.profile["features"][name], counted) for name, counted in side.counts.items()]
    return sorted(rows, key=lambda r: (-(r["psi"] or 0), -(r["unseen_share"] or 0), r["feature"]))
