"""What a model predicts: the task recorded in `trainserve.json` and in the shared split, read by the eval
client to pick its metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

TaskKind = Literal["classification", "regression"]


@dataclass(frozen=True)
class Task:
    """What a model predicts, as `trainserve.json` records it under "task": training writes it, the eval
    client reads it to pick its metrics. Classification: `classes` (K) and optional `label_names`;
    regression: `targets` (T, the width of `predictions` [N, T])."""

    kind: TaskKind
    classes: int = 0
    targets: int = 0
    label_names: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "classes": self.classes,
            "targets": self.targets,
            "label_names": list(self.label_names),
        }

    @classmethod
    def from_json(cls, raw: dict) -> Task:
        return cls(
            raw["kind"], int(raw.get("classes", 0)), int(raw.get("targets", 0)), tuple(raw.get("label_names", ()))
        )
