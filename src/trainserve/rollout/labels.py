"""Which versions a model's rollout labels name, and so which versions TF Serving must keep loaded.

Three labels: `stable` (what clients ask for), `previous` (the stable before it, kept loaded so that a
rollback is a label move, not a load) and `candidate` (published, loaded, awaiting its evaluation).
The version policy is derived from them, `specific { versions: [...] }` = exactly the labelled
versions (plus one being loaded before its label is set): a label never names a version the policy
unloads, which would break the next config reload and every restart (tensorflow/serving#1608).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from trainserve.errors import TrainserveError

STABLE, PREVIOUS, CANDIDATE = "stable", "previous", "candidate"
ROLLOUT_LABELS = (STABLE, PREVIOUS, CANDIDATE)


@dataclass(frozen=True)
class Rollout:
    """One model's rollout labels (None: unset)."""

    stable: int | None = None
    previous: int | None = None
    candidate: int | None = None

    @classmethod
    def of(cls, model_config) -> Rollout:
        """The labels of a ModelConfig (trainserve.protos.model_server_config_pb2)."""
        labels = model_config.version_labels
        return cls(*(labels.get(name) for name in ROLLOUT_LABELS))

    def labels(self) -> dict[str, int]:
        pairs = zip(ROLLOUT_LABELS, (self.stable, self.previous, self.candidate), strict=True)
        return {name: version for name, version in pairs if version is not None}

    def versions(self, loading: int | None = None) -> list[int]:
        """The versions to keep loaded: the labelled ones, and `loading` (a version not labelled yet)."""
        return sorted(set(self.labels().values()) | ({loading} if loading is not None else set()))

    def with_candidate(self, version: int) -> Rollout:
        """`version` becomes the candidate; an earlier candidate that was never promoted is dropped."""
        if version == self.stable:
            raise TrainserveError(f"version {version} is already stable: expected a newer version to stage")
        return replace(self, candidate=version)

    def promoted(self) -> Rollout:
        """stable -> the candidate; the old stable is kept as previous (for rollback); no candidate left."""
        if self.candidate is None:
            raise TrainserveError("no candidate to promote: expected `trainserve candidate` to have staged one")
        return Rollout(stable=self.candidate, previous=self.stable, candidate=None)

    def rolled_back(self) -> Rollout:
        """stable -> previous; the rolled-back version is unloaded; a pending candidate stays."""
        if self.previous is None:
            which = f"stable is version {self.stable}" if self.stable else "nothing is stable yet"
            raise TrainserveError(f"no previous stable version is kept to roll back to ({which})")
        return Rollout(stable=self.previous, previous=None, candidate=self.candidate)

    def describe(self) -> str:
        return ", ".join(f"{name} -> {version}" for name, version in self.labels().items()) or "no labels"


def apply_rollout(model_config, rollout: Rollout, loading: int | None = None) -> None:
    """Set a ModelConfig's version policy and rollout labels from `rollout`, in place.

    Other labels are kept only where they name a kept version: one left on an unloaded version would be
    refused by the next reload (tensorflow/serving#1608), so that is an error naming the label.
    """
    versions = rollout.versions(loading)
    if not versions:
        raise TrainserveError(f"model {model_config.name}: no version to serve (no label is set)")
    for label, version in model_config.version_labels.items():
        if label not in ROLLOUT_LABELS and version not in versions:
            raise TrainserveError(
                f"model {model_config.name}: label {label!r} names version {version}, which this change would "
                f"unload (kept: {versions}); move or remove that label first"
            )
    for label in ROLLOUT_LABELS:
        model_config.version_labels.pop(label, None)
    model_config.version_labels.update(rollout.labels())
    model_config.model_version_policy.specific.Clear()
    model_config.model_version_policy.specific.versions.extend(versions)  # sets the `specific` oneof
