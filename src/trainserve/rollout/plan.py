"""A progressive rollout's step plan, as a person writes it: `shadow 10m, 5% 10m, 25% 10m, 100%`.

    shadow [P%] DURATION   P % of `stable` requests (default 100) also sent to the candidate, answers compared;
                           every client still gets stable's answer
    P% DURATION            P % of `stable` requests answered by the candidate (the shadow, if any, goes on)
    100%                   the last step: promote the candidate to `stable`, as `trainserve promote` does

A duration is a number with a unit (`30s`, `10m`, `1h`, `0.5s`): the least time a step is watched before it may
advance. Shadow steps come first, canary shares rise, and the plan ends with `100%`. A step may end with
`hold DURATION`: how long it may stay inconclusive past its duration before the rollout pauses (default:
--max-hold); the plan `auto` sizes both from the model's traffic (trainserve.rollout.sizing) and writes them so.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import Literal

SHADOW, CANARY, PROMOTE = "shadow", "canary", "promote"
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smh])")
_PERCENT = re.compile(r"(\d+(?:\.\d+)?)%")
EXAMPLE_PLAN = "shadow 10m, 5% 10m, 25% 10m, 100%"  # the errors' example, and the plan before `auto`
AUTO = "auto"  # `trainserve rollout --plan`'s default: sized from the model's request rate


@dataclass(frozen=True)
class Step:
    """One step: what the routing file says during it, and how long it is watched at least."""

    kind: Literal["shadow", "canary", "promote"]
    percent: float  # the shadow's share (shadow), the candidate's share (canary), 100 (promote)
    seconds: float  # 0 for promote
    hold: float | None = None  # seconds it may stay inconclusive past `seconds` (None: --max-hold)

    def words(self) -> str:
        if self.kind == PROMOTE:
            return "100%"
        share = f"{_num(self.percent)}%"
        words = f"shadow {share} {_num(self.seconds)}s" if self.kind == SHADOW else f"{share} {_num(self.seconds)}s"
        return words if self.hold is None else f"{words} hold {_num(self.hold)}s"


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]

    def text(self) -> str:
        """The plan in its canonical words (the history keeps it; a resumed rollout must follow the same)."""
        return ", ".join(step.words() for step in self.steps)

    def shadow_during(self, index: int) -> float:
        """The shadow's share during step `index`: a shadow step's own, then the last one's through the canary
        steps (so the online flip rate keeps being measured while clients get the candidate's answers)."""
        shadows = [s.percent for s in self.steps[: index + 1] if s.kind == SHADOW]
        return shadows[-1] if shadows else 0.0

    def canary_during(self, index: int) -> float:
        step = self.steps[index]
        return step.percent if step.kind == CANARY else 0.0


def _num(value: float) -> str:
    return f"{value:g}"


def duration(text: str) -> float:
    """A flag's duration (`30m`, `4h`, `90s`) in seconds."""
    if not _is_duration(text.strip()):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a duration above 0 with a unit (s, m or h), as in 30m")
    return _seconds(text.strip())


def plan_or_auto(text: str) -> Plan | str:
    """--plan: `auto`, or a plan as parse_plan reads it."""
    return AUTO if text.strip() == AUTO else parse_plan(text)


def parse_plan(text: str) -> Plan:
    """`shadow 10m, 5% 10m, 25% 10m, 100%` -> Plan; anything else is an error naming what was expected."""
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or not all(items):
        raise argparse.ArgumentTypeError(f"{text!r}: expected steps separated by commas, such as {EXAMPLE_PLAN!r}")
    steps = tuple(_parse_step(item) for item in items)
    _check_order(text, steps)
    return Plan(steps)


def _parse_step(item: str) -> Step:
    words = item.split()
    kind = SHADOW if words[0] == SHADOW else CANARY
    rest = words[1:] if kind == SHADOW else words
    percent = 100.0 if kind == SHADOW else None
    if rest and _PERCENT.fullmatch(rest[0]):
        percent = float(rest[0][:-1])
        rest = rest[1:]
    if percent is None or not 0 < percent <= 100:
        raise argparse.ArgumentTypeError(f"step {item!r}: expected a share in % above 0 and at most 100, as in 5%")
    if kind == CANARY and percent == 100 and not rest:
        return Step(PROMOTE, 100.0, 0.0)
    hold = None
    if len(rest) == 3 and rest[1] == "hold" and _is_duration(rest[2]):
        hold, rest = _seconds(rest[2]), rest[:1]
    if len(rest) != 1 or not _is_duration(rest[0]):
        raise argparse.ArgumentTypeError(
            f"step {item!r}: expected one duration above 0 with a unit (s, m or h), as in 5% 10m, then optionally "
            "`hold DURATION`"
        )
    return Step(kind, percent, _seconds(rest[0]), hold)


def _is_duration(word: str) -> bool:
    return bool(_DURATION.fullmatch(word)) and float(word[:-1]) > 0


def _seconds(word: str) -> float:
    return float(word[:-1]) * _UNITS[word[-1]]


def _check_order(text: str, steps: tuple[Step, ...]) -> None:
    if steps[-1].kind != PROMOTE or any(s.kind == PROMOTE for s in steps[:-1]):
        raise argparse.ArgumentTypeError(f"{text!r}: expected the plan to end with `100%` (promote), and only there")
    if len(steps) == 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected a step before `100%` (to promote at once: trainserve promote)"
        )
    kinds = [s.kind for s in steps[:-1]]
    if CANARY in kinds and SHADOW in kinds[kinds.index(CANARY) :]:
        raise argparse.ArgumentTypeError(f"{text!r}: expected the shadow steps before the canary shares")
    shares = [s.percent for s in steps if s.kind == CANARY]
    if any(b <= a for a, b in zip(shares, shares[1:])):
        raise argparse.ArgumentTypeError(f"{text!r}: expected each canary share above the one before")
