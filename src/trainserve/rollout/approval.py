"""A person's go-ahead before one step of a rollout (--approve-before STEP), and the command that gives it.

Before entering that step the controller holds the route safe: the step before's routing with no canary share
(its shadow goes on; before the first step, no share at all), writes AWAITING to the history (notified once) and
looks every --interval for an APPROVED record of this rollout, which `trainserve rollout --approve --reason TEXT`
appends with who ran it (user@host) and why. It waits as long as that takes: --max-hold pauses a step that cannot
decide, while a rollout waiting for a person has decided all it can, and a pause would only end the wait. Labels
moved meanwhile roll it back, as in a step. An approval given before the controller reaches the step counts; a
controller killed while waiting and run again waits again, with the route still safe, before it resumes the step
it had finished. After the approval the step is entered as any other (a promotion: promoted at once).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from trainserve.errors import TrainserveError
from trainserve.rollout import moves
from trainserve.rollout.config_file import find_model, history_path, read_config
from trainserve.rollout.history import append_history, read_history
from trainserve.rollout.progress import APPROVED, AWAITING, ROLLOUT, START, STEP, event, in_progress, same_rollout
from trainserve.rollout.rollout_config import step_index

if TYPE_CHECKING:
    from trainserve.rollout.notify import Notifier
    from trainserve.rollout.plan import Plan
    from trainserve.rollout.rollout_config import RolloutConfig

log = logging.getLogger(__name__)


def this_rollout(history: list[dict], start: dict) -> list[dict]:
    """The records of the rollout that `start` began, after it."""
    mine = [e for e in history if e.get("action") == ROLLOUT and e.get("model") == start["model"]]
    starts = [i for i, e in enumerate(mine) if e["event"] == START and same_rollout(e, start)]
    return mine[starts[-1] + 1 :] if starts else []


class Approvals:
    """The wait before --approve-before's step, for one model's controller: `plan()` is the plan it follows (known
    once it starts: `auto` is sized then), `same_labels(start)` raises when the labels moved under it,
    `append(kind, start, **fields)` writes the history (and notifies)."""

    def __init__(
        self,
        config: RolloutConfig,
        plan: Callable[[], Plan],
        notifier: Notifier,
        same_labels: Callable[[dict], None],
        append: Callable[..., dict],
        sleep: Callable[[float], None],
    ):
        self.config, self.notifier, self.same_labels, self.append = config, notifier, same_labels, append
        self.sleep, self.plan = sleep, plan
        self.history = history_path(config.config)

    @property
    def step(self) -> int | None:
        """The index of the step to approve (None: no --approve-before)."""
        name = self.config.approve_before
        return step_index(self.plan(), name) if name is not None else None

    def check(self) -> None:
        """Refuse, in one line, an --approve-before that names no step of the plan."""
        self.step  # noqa: B018 (step_index raises)

    def before(self, start: dict, index: int) -> None:
        """Return once step `index` may be entered: at once unless it is the step to approve and no approval of
        this rollout is in the history yet; else the route held safe until one is."""
        if index != self.step or self._approval(start) is not None:
            return
        plan, routing, model = self.plan(), self.config.routing_file, start["model"]
        shadow = plan.shadow_during(index - 1) if index > 0 else 0.0
        moves.set_route(routing, model, moves.step_route(start, shadow, 0))
        if self._awaiting(start) != index:
            self.append(AWAITING, start, step=index, words=plan.steps[index].words())
        log.info(
            "model %s: waiting for approval before step %d (%s): `trainserve rollout --approve --reason TEXT`",
            model,
            index + 1,
            plan.steps[index].words(),
        )
        while (approval := self._approval(start)) is None:
            self.same_labels(start)
            self.sleep(self.config.interval)
        log.info("model %s: step %d approved by %s: %s", model, index + 1, approval.get("by"), approval.get("reason"))
        self.notifier.approved(start, approval)

    def resume(self, start: dict) -> None:
        """A controller killed while it waited: it waits again before resuming anything."""
        awaiting = self._awaiting(start)
        if awaiting is not None:
            self.before(start, awaiting)

    def _approval(self, start: dict) -> dict | None:
        records = this_rollout(read_history(self.history), start)
        return next((e for e in records if e["event"] == APPROVED), None)

    def _awaiting(self, start: dict) -> int | None:
        """The step the history says the controller waits before (None: it entered a step since, or never waited)."""
        records = [e for e in this_rollout(read_history(self.history), start) if e["event"] in (AWAITING, STEP)]
        return records[-1]["step"] if records and records[-1]["event"] == AWAITING else None


def approve(config: RolloutConfig) -> str:
    """`trainserve rollout --approve --reason TEXT`: an APPROVED record for the rollout in progress."""
    model = find_model(read_config(config.config), config.config, config.model).name
    history = history_path(config.config)
    progress = in_progress(read_history(history), model)
    if progress is None:
        raise TrainserveError(f"no rollout of model {model} is in progress in {history}: nothing to approve")
    if config.candidate is not None and config.candidate != progress.candidate:
        raise TrainserveError(
            f"--approve --candidate {config.candidate}: the rollout of model {model} in progress is of version "
            f"{progress.candidate}"
        )
    record = append_history(history, event(APPROVED, model, progress.candidate, reason=config.reason))
    return (
        f"approved by {record['by']}: model {model} version {progress.candidate} ({config.reason}); a controller "
        "waiting for approval goes on at its next look"
    )
