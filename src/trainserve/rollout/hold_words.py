"""What a holding step says to a person: why it holds, once, as a WARNING; then at each look one INFO line of
where it stands (how long it has held, how long until it pauses); a WARNING again when the reason changes or
clears. A step that cannot be judged (Prometheus cannot be reached, too few requests) may hold for its whole hold,
30 minutes by default: the same WARNING every --interval told nothing new and hid how long was left.

    WARNING model digits: step 1 (shadow 100% 1m) holds: Prometheus at http://prometheus:9090 cannot be reached:
            connection refused; it pauses once held 30m, in 30m
    INFO    model digits: step 1 (shadow 100% 1m) held 2m of 30m, pauses in 28m: Prometheus at ... cannot be reached
    WARNING model digits: step 1 (shadow 100% 1m) holds no longer (was: Prometheus at ... cannot be reached: ...)
"""

from __future__ import annotations

import logging

from trainserve.rollout import analysis
from trainserve.rollout.analysis import Check
from trainserve.rollout.sizing.choose import hours

log = logging.getLogger("trainserve.rollout.controller")


class HoldWords:
    """The hold lines of one model's rollout: the reason said last (None: not holding) and at which step."""

    def __init__(self, model: str):
        self.model = model
        self.step: int | None = None
        self.words = ""  # the held step's words, said again when it holds no longer (maybe from the next step)
        self.reason: str | None = None

    def holding(self, index: int, words: str, reason: str, held: float, limit: float, detail: str = "") -> None:
        """Step `index` held `held` seconds of `limit` (then it pauses), for `reason` (`detail`: its words in full,
        said with the WARNING)."""
        where = f"model {self.model}: step {index + 1} ({words})"
        left = hours(max(limit - held, 0.0))
        if (index, reason) != (self.step, self.reason):
            said = detail if detail and detail != reason else reason
            log.warning("%s holds: %s; it pauses once held %s, in %s", where, said, hours(limit), left)
            self.step, self.words, self.reason = index, words, reason
        elif held < limit:  # at the limit the pause says it
            log.info("%s held %s of %s, pauses in %s: %s", where, hours(held), hours(limit), left, reason)

    def cleared(self, now: str) -> None:
        """The step held last no longer holds for the reason said (`now`: what it does instead)."""
        if self.reason is None:
            return
        where = f"model {self.model}: step {self.step + 1} ({self.words})"
        log.warning("%s holds no longer, %s (was: %s)", where, now, self.reason)
        self.step, self.reason = None, None


def undecided(found: list[Check], unjudged: str | None) -> str:
    """Why a step whose time is up holds, in words that change only when the reason does (not with its counts)."""
    names = [check.name for check in found if check.result != analysis.PASS]
    said = f"not yet decided at the step's end: {', '.join(names)}" if names else "its counts are not all judged"
    return said + ("; some counts unjudged" if unjudged and names else "")
