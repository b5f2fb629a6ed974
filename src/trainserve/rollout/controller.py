"""`trainserve rollout`: a candidate moved through a step plan on live traffic, judged on Prometheus between steps.

    start     the candidate's offline evidence checked as promote checks it (a refusal moves nothing), the version
              labelled `candidate` if it is not yet
    each step its routing written (shadow share, canary share) and watched: every --interval the proxy's counts
              and the recording rules are asked (trainserve.rollout.analysis); a check that fails rolls back at
              once; once the step's time is up and every check passes, the next step; too few requests, or no
              answer from Prometheus, holds (never advances), up to --max-hold, then the controller stops paused
    100%      promote, as `trainserve promote` (its checks again, its history line), then the routing cleared
    rollback  routing cleared (every client on stable), the `candidate` label dropped, stable untouched

Everything lands in the rollout history (trainserve.rollout.progress), from which a killed controller resumes.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from trainserve.capture.routing import ModelRoute
from trainserve.errors import TrainserveError
from trainserve.rollout import analysis, moves
from trainserve.rollout.config import CandidateConfig, PromoteConfig, RolloutConfig
from trainserve.rollout.config_file import find_model, history_path, locked, read_config
from trainserve.rollout.history import append_history, read_history
from trainserve.rollout.labels import Rollout
from trainserve.rollout.measure import Meter
from trainserve.rollout.offline import evidence_of, offline_summary
from trainserve.rollout.plan import PROMOTE
from trainserve.rollout.progress import (
    CHECK,
    PAUSED,
    PROMOTED,
    ROLLBACK,
    ROLLED_BACK,
    START,
    STEP,
    Progress,
    event,
    in_progress,
)
from trainserve.rollout.progress import PROMOTE as PROMOTE_EVENT
from trainserve.rollout.prometheus import Prometheus, PrometheusUnreachable
from trainserve.rollout.steps import Server, promote, stage_candidate

log = logging.getLogger(__name__)


class RolloutPaused(TrainserveError):
    """Held longer than --max-hold: the routing stays where it is; run the controller again to resume."""

    exit_code = 75  # EX_TEMPFAIL: try again later (a Job's retry resumes it)


@dataclass(frozen=True)
class Outcome:
    promoted: bool
    said: str


class Controller:
    """One rollout of one model's candidate. `clock` (epoch seconds) and `sleep` are time's, or a test's."""

    def __init__(
        self,
        config: RolloutConfig,
        prometheus: Prometheus | None,
        server: Server | None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.config, self.prometheus, self.server = config, prometheus, server
        self.clock, self.sleep = clock, sleep
        self.history = history_path(config.config)
        self.model = find_model(read_config(config.config), config.config, config.model).name

    # -- the run -------------------------------------------------------------------------------------------

    def run(self) -> Outcome:
        with self._only_controller():
            progress = in_progress(read_history(self.history), self.model)
            if self.config.abort:
                return self._abort(progress)
            progress = self._resume(progress) if progress is not None else self._start()
            return self._follow(progress)

    def _follow(self, progress: Progress) -> Outcome:
        start, plan = progress.start, self.config.plan
        if progress.pending is not None:  # a move decided before the controller was killed: finish it
            if progress.pending["event"] == ROLLBACK:
                return self._rolled_back(start, progress.pending["said"])
            return self._promoted(start)
        index, started, counters = progress.step, progress.step_started, progress.counters
        if index is not None:
            self._route(start, index)  # the step's routing, again: the move may not have been made
            left = max(0.0, started + plan.steps[index].seconds - self.clock())
            log.info("model %s: resuming step %d (%s), %.0f s left", self.model, index + 1, self._words(index), left)
        else:
            index, started, counters = self._enter(start, 0)
        while True:
            failed = self._watch(start, index, started, counters)
            if failed:
                self._append(ROLLBACK, start, step=index, said=failed)
                return self._rolled_back(start, failed)
            if plan.steps[index + 1].kind == PROMOTE:
                self._append(PROMOTE_EVENT, start, step=index + 1)
                return self._promoted(start)
            index, started, counters = self._enter(start, index + 1)

    # -- start and resume ----------------------------------------------------------------------------------

    def _start(self) -> Progress:
        """The evidence promote would check, then the candidate label: a refusal moves nothing."""
        config, labels = self.config, self._labels()
        version = candidate_of(config, labels, self.model)
        if labels.stable is None:
            raise TrainserveError(
                f"model {self.model} has no stable version: expected `trainserve promote` for the first one "
                "(clients ask for `stable`; there is nothing to shift them from)"
            )
        if version == labels.stable:
            raise TrainserveError(f"model {self.model} version {version} is already stable: nothing to roll out")
        route = moves.route_of(config.routing_file, self.model)
        if route is not None:
            raise TrainserveError(
                f"routing file {config.routing_file} already routes model {self.model} to version {route.candidate} "
                "with no rollout of it in the history: expected no route for the model before a rollout"
            )
        read = evidence_of(config, self.model, labels, version)
        if labels.candidate != version:
            self._stage(version)
        start = self._append(
            START,
            {"candidate": version},
            plan=config.plan.text(),
            stable=labels.stable,
            flips=read.report["task"]["kind"] == "classification",
            report=str(read.path),
            report_sha256=read.sha256,
            offline=offline_summary(read, config.replay, labels.stable),
            gate=asdict(config.gate),
            prometheus=config.prometheus,
            routing_file=str(config.routing_file),
        )
        log.info(
            "model %s: rollout of version %d begun (stable %d): %s", self.model, version, labels.stable, start["plan"]
        )
        return Progress(start=start)

    def _stage(self, version: int) -> None:
        if self.server is None:
            raise TrainserveError(
                f"version {version} is not the candidate yet: expected --server, so that it is labelled once loaded"
            )
        c = self.config
        staged = CandidateConfig(c.config, self.model, version=version, server=c.server, wait=c.wait, tls=c.tls)
        stage_candidate(staged, self.server)

    def _resume(self, progress: Progress) -> Progress:
        """The rollout in the history is this one, stable has not moved under it, and it follows the same plan."""
        start, config = progress.start, self.config
        said = f"a rollout of model {self.model} version {progress.candidate} is in progress ({self.history})"
        if config.candidate is not None and config.candidate != progress.candidate:
            raise TrainserveError(f"{said}: expected --candidate {progress.candidate} to resume it, or --abort first")
        if start["plan"] != config.plan.text():
            raise TrainserveError(f"{said} with the plan {start['plan']!r}: expected the same --plan to resume it")
        labels = self._labels()
        if labels.stable != start["stable"] and not (progress.pending and labels.stable == progress.candidate):
            raise TrainserveError(
                f"{said}, but stable moved from version {start['stable']} to {labels.stable} since: expected --abort"
            )
        return progress

    def _abort(self, progress: Progress | None) -> Outcome:
        if progress is None:
            raise TrainserveError(
                f"no rollout of model {self.model} is in progress in {self.history}: nothing to abort"
            )
        said = f"aborted: {self.config.reason}"
        self._append(ROLLBACK, progress.start, step=progress.step, said=said)
        return self._rolled_back(progress.start, said)

    # -- steps ---------------------------------------------------------------------------------------------

    def _enter(self, start: dict, index: int) -> tuple[int, float, dict]:
        """The step's origin of counts (the proxy's counters now, from Prometheus), recorded, then its routing."""
        counters = self._ask(start, index, lambda: self._meter(start).origin())
        started = self.clock()
        self._append(STEP, start, step=index, words=self._words(index), started=started, counters=counters)
        self._route(start, index)
        log.info("model %s: step %d of %d: %s", self.model, index + 1, len(self.config.plan.steps), self._words(index))
        return index, started, counters

    def _route(self, start: dict, index: int) -> None:
        plan = self.config.plan
        route = ModelRoute(
            start["candidate"], plan.shadow_during(index), plan.canary_during(index), self.config.sticky_header
        )
        moves.set_route(self.config.routing_file, self.model, route)

    def _watch(self, start: dict, index: int, started: float, counters: dict) -> str | None:
        """Look every --interval until the step advances (None) or fails (why, one line)."""
        step, plan = self.config.plan.steps[index], self.config.plan
        flips = start["flips"] and plan.shadow_during(index) > 0
        meter, offline = self._meter(start), start.get("offline") or {}
        held_since = None
        while True:
            ended = self.clock() >= started + step.seconds
            look = self._ask(start, index, lambda state=counters: meter.look(state))
            changed, counters = look.state != counters, look.state
            found = analysis.checks(step, flips, look.counts, look.values, self.config.gate, offline)
            decision = analysis.decide(found, ended)
            if look.unjudged and decision == analysis.ADVANCE:  # never advance on counts that may be incomplete
                decision = analysis.HOLD
            self._append(
                CHECK,
                start,
                step=index,
                queries={n: {"query": q, "value": look.values.get(n)} for n, q in meter.queries.items()},
                counts=look.counts,
                checks=[asdict(c) for c in found],
                decision=decision,
                **({"state": counters} if changed else {}),
                **({"unjudged": look.unjudged} if look.unjudged else {}),
            )
            said = "; ".join([f"{c.name}: {c.said}" for c in found] + ([look.unjudged] if look.unjudged else []))
            log.info("model %s step %d (%s): %s (%s)", self.model, index + 1, self._words(index), decision, said)
            if decision == analysis.ROLLBACK:
                return "; ".join(f"{c.name}: {c.said}" for c in found if c.result == analysis.FAIL)
            if decision == analysis.ADVANCE:
                return None
            if decision == analysis.HOLD:
                held_since = held_since if held_since is not None else self.clock()
                self._pause_if_held(start, index, held_since, said)
            left = started + step.seconds - self.clock()
            self.sleep(min(self.config.interval, left) if left > 0 else self.config.interval)

    def _ask(self, start: dict, index: int, question: Callable[[], dict]) -> dict:
        """`question()` answered by Prometheus, waiting (holding) while it cannot be reached, up to --max-hold."""
        held_since = None
        while True:
            try:
                return question()
            except PrometheusUnreachable as exc:
                held_since = held_since if held_since is not None else self.clock()
                log.warning("model %s: holding at step %d (%s): %s", self.model, index + 1, self._words(index), exc)
                self._pause_if_held(start, index, held_since, str(exc))
                self.sleep(self.config.interval)

    def _pause_if_held(self, start: dict, index: int, since: float, why: str) -> None:
        held = self.clock() - since
        if held < self.config.max_hold:
            return
        self._append(PAUSED, start, step=index, said=why, held_seconds=held)
        raise RolloutPaused(
            f"rollout of model {self.model} version {start['candidate']} paused at step {index + 1} "
            f"({self._words(index)}) after holding {held:.0f} s: {why}; the routing stays as it is: run the same "
            "command again to resume it, or --abort --reason TEXT"
        )

    # -- measures ------------------------------------------------------------------------------------------

    def _meter(self, start: dict) -> Meter:
        return Meter(self.prometheus, self.model, start["candidate"], start["stable"], self.config.proxy_job)

    # -- the two ends --------------------------------------------------------------------------------------

    def _rolled_back(self, start: dict, said: str) -> Outcome:
        moves.clear_route(self.config.routing_file, self.model)
        before, after = moves.drop_candidate(self.config.config, self.model, start["candidate"])
        self._append(ROLLED_BACK, start, said=said, before=before.labels(), after=after.labels())
        return Outcome(False, f"model {self.model} version {start['candidate']}: {said}; {after.describe()}")

    def _promoted(self, start: dict) -> Outcome:
        labels = self._labels()
        if labels.stable != start["candidate"]:
            c = self.config
            report = Path(start["report"])
            promote(PromoteConfig(c.config, report, c.replay, server=c.server, wait=c.wait, tls=c.tls), self.server)
            labels = self._labels()
        moves.clear_route(self.config.routing_file, self.model)
        self._append(PROMOTED, start, after=labels.labels())
        return Outcome(True, f"model {self.model}: {labels.describe()}")

    # -- helpers -------------------------------------------------------------------------------------------

    def _labels(self) -> Rollout:
        return Rollout.of(find_model(read_config(self.config.config), self.config.config, self.model))

    def _words(self, index: int) -> str:
        return self.config.plan.steps[index].words()

    def _append(self, kind: str, start: dict, **fields) -> dict:
        return append_history(self.history, event(kind, self.model, start["candidate"], **fields))

    def _only_controller(self) -> contextlib.AbstractContextManager[None]:
        """One controller per model and config: a second one is refused at once, not interleaved."""
        holder = f"another `trainserve rollout` of model {self.model}"
        return locked(self.config.config, f"rollout-{self.model}.lock", holder)


def candidate_of(config: RolloutConfig, labels: Rollout, model: str) -> int:
    """--candidate, or else the version the config labels `candidate` (staged by `trainserve candidate`)."""
    if config.candidate is not None:
        return config.candidate
    if labels.candidate is None:
        raise TrainserveError(f"model {model} has no `candidate` label: expected --candidate VERSION")
    return labels.candidate
