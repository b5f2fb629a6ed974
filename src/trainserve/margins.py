"""The margins a comparison allows (`--max-drop METRIC=DROP[%]`), and which way each metric is better: one
grammar for eval's gates and live-eval's."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

HIGHER_IS_BETTER = frozenset({"accuracy", "top_k_accuracy", "r2", "roc_auc", "average_precision"})
LOWER_IS_BETTER = frozenset({"loss", "mse", "rmse", "mae"})
_MARGIN = re.compile(r"^\s*([a-z_0-9]+)\s*=\s*([0-9.eE+]+)\s*(%?)\s*$")


@dataclass(frozen=True)
class Margin:
    """The largest change for the worse `metric` may show: absolute, or in % of the baseline's value."""

    metric: str
    drop: float
    relative: bool = False
    default: bool = False  # applied because --max-drop named none (the report says so)

    def describe(self) -> str:
        return f"{self.metric}={self.drop:g}{'%' if self.relative else ''}"

    def absolute(self, baseline: float) -> float:
        return self.drop / 100 * abs(baseline) if self.relative else self.drop


def parse_margins(text: str) -> tuple[Margin, ...]:
    """`accuracy=0.01,loss=5%` -> margins (each metric needs a known direction)."""
    margins = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        match = _MARGIN.match(item)
        if not match:
            raise argparse.ArgumentTypeError(f"{item!r}: expected METRIC=DROP or METRIC=DROP%, e.g. accuracy=0.01")
        if match[1] not in HIGHER_IS_BETTER | LOWER_IS_BETTER:
            known = ", ".join(sorted(HIGHER_IS_BETTER | LOWER_IS_BETTER))
            raise argparse.ArgumentTypeError(f"{item!r}: no direction known for {match[1]!r}: expected one of {known}")
        margins.append(Margin(match[1], float(match[2]), bool(match[3])))
    return tuple(margins)
