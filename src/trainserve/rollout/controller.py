"""`trainserve rollout`: a candidate moved through a step plan on live traffic, judged on Prometheus between steps.

    start     the candidate's offline evidence checked as promote checks it (a refusal moves nothing), the START
              record written, the model routed with no share (a request naming no version is answered by stable),
              and, once every proxy replica reports that route, the version labelled `candidate` if it is not yet
    each step its routing written (shadow share, canary share) and watched: every --interval the proxy's counts
              and the recording rules are asked (trainserve.rollout.analysis); a check that fails rolls back at
              once; once the step's time is up and every check passes, the next step; too few requests, or no
              answer from Prometheus, holds (never advances), up to --max-hold, then the controller stops paused
              with the route held on stable; each look re-reads the labels: a `candidate` or `stable` moved by
              anyone else rolls back
    100%      promote, as `trainserve promote` (its checks again, its history line), then the routing cleared
    bake      with --bake, the new stable judged against previous before the rollout ends: trainserve.rollout.bake
    rollback  and the other ends: trainserve.rollout.ends

Everything lands in the rollout history (trainserve.rollout.progress), from which a killed controller resumes. Any
failure after the first routing write leaves the model's route with no canary share and no shadow. Each decision
is told to --notify's receivers (trainserve.rollout.notify); --approve-before waits for a person before its step
(trainserve.rollout.approval).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import asdict

from trainserve.errors import TrainserveError
from trainserve.files import locked
from trainserve.rollout import analysis, moves
from trainserve.rollout.approval import Approvals
from trainserve.rollout.bake import Bake
from trainserve.rollout.config import CandidateConfig
from trainserve.rollout.config_file import find_model, history_path, read_config
from trainserve.rollout.ends import Ends, Outcome
from trainserve.rollout.follow import routed_to
from trainserve.rollout.history import append_history, read_history
from trainserve.rollout.hold_words import HoldWords, undecided
from trainserve.rollout.labels import Rollout
from trainserve.rollout.look_words import Narrator
from trainserve.rollout.measure import Meter
from trainserve.rollout.notify import notifier
from trainserve.rollout.plan import AUTO, PROMOTE, Plan, parse_plan
from trainserve.rollout.progress import CHECK, RESUMED, ROLLBACK, START, STEP, Progress, event, in_progress
from trainserve.rollout.progress import PROMOTE as PROMOTE_EVENT
from trainserve.rollout.prometheus import Prometheus, PrometheusUnreachable
from trainserve.rollout.rollout_config import RolloutConfig
from trainserve.rollout.start import may_begin
from trainserve.rollout.steps import Server, stage_candidate

log = logging.getLogger(__name__)


class LabelsMoved(Exception):
    """Someone else moved `candidate` or `stable` under the rollout: it rolls back (the message says which)."""


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
        self.plan: Plan | None = config.plan if config.plan != AUTO else None  # `auto`: resolved at the start
        self._started = 0.0  # when the step being watched began (its watched time, kept by a pause)
        self.model = find_model(read_config(config.config), config.config, config.model).name
        self.ends = Ends(config, self.model, prometheus, server, self._labels, self._append, clock, sleep)
        self.notifier = notifier(config, self.history, self.model)  # told of every record _append writes
        self.narrator = Narrator(self.model, config.gate)
        self.holds = HoldWords(self.model)  # a hold said once, then where it stands
        self.approvals = Approvals(config, lambda: self.plan, self.notifier, self._same_labels, self._append, sleep)
        self.bake = Bake(self.ends)  # after the promotion

    # -- the run -------------------------------------------------------------------------------------------

    def run(self) -> Outcome:
        with self._only_controller(), self.notifier, self.narrator:
            progress = in_progress(read_history(self.history), self.model)
            if self.config.abort:
                if progress is None:
                    raise TrainserveError(
                        f"no rollout of model {self.model} is in progress in {self.history}: nothing to abort"
                    )
                return self.bake.abort(progress) if progress.promoted else self.ends.abort(progress.start)
            progress = self._resume(progress) if progress is not None else self._start()
            try:
                return self._follow(progress)
            except BaseException:  # never a canary share nor a shadow on a version no controller judges
                moves.hold_route(self.config.routing_file, self.model)
                raise

    def _follow(self, progress: Progress) -> Outcome:
        start, plan = progress.start, self.plan
        if progress.promoted:  # killed after the promotion: its bake, begun or not, finished
            return self.bake.resume(progress)
        if progress.pending is not None:  # a move decided before the controller was killed: finish it
            if progress.pending["event"] == ROLLBACK:
                return self.ends.rolled_back(start, progress.pending["said"])
            return self.bake.after_promotion(start, self.ends.promoted(start))
        index = progress.step
        try:
            self.approvals.resume(start)  # killed while waiting for approval: it waits again first
            index, started, counters = self._begin(progress)
            while True:
                failed = self._watch(start, index, started, counters)
                if failed:
                    break
                if plan.steps[index + 1].kind == PROMOTE:
                    self.approvals.before(start, index + 1)
                    self._append(PROMOTE_EVENT, start, step=index + 1)
                    return self.bake.after_promotion(start, self.ends.promoted(start))
                index, started, counters = self._enter(start, index + 1)
        except LabelsMoved as exc:
            failed = str(exc)
        self._append(ROLLBACK, start, step=index, said=failed)
        return self.ends.rolled_back(start, failed)

    def _begin(self, progress: Progress) -> tuple[int, float, dict]:
        """The step to watch first: the first (once the candidate is staged), or the one a pause or a kill left,
        resumed with the counts it had (its bounds hold over every look, before and after) and the time it had
        left; a resume is recorded (RESUMED) so that the history shows every run of the controller."""
        start, index = progress.start, progress.step
        if index is None:
            self._prepare(start)
            return self._enter(start, 0)
        step = self.plan.steps[index]
        if progress.paused:  # its routing was held: the counters moved without the candidate; its time stood still
            started = self._started = self.clock() - min(progress.watched, step.seconds)
            counters = self._ask(start, index, lambda: self._meter(start).rebased(progress.counters))
        else:
            counters, started = progress.counters, progress.step_started
        left = max(0.0, started + step.seconds - self.clock())
        after = "a pause" if progress.paused else "a stop"
        self._append(RESUMED, start, step=index, after=after, started=started, counters=counters)
        self._route(start, index)  # the step's routing, again: held by the pause, or not yet written by the stop
        log.info(
            "model %s: resuming step %d (%s) after %s with its counts, %.0f s left",
            *(self.model, index + 1, self._words(index), after, left),
        )
        self._started = started
        return index, started, counters

    # -- start and resume ----------------------------------------------------------------------------------

    def _start(self) -> Progress:
        """Every refusal before anything moves (trainserve.rollout.start), then the START record, under the
        config's lock (no `trainserve candidate` in between: it refuses once the record is there)."""
        config, labels = self.config, self._labels()
        begun = may_begin(config, self.prometheus, self.model, labels, self.server is not None, self.clock())
        self.plan = begun.plan
        self.approvals.check()  # --approve-before names a step of the plan `auto` chose, or is refused now
        with locked(config.config):
            if self._labels() != labels:
                raise TrainserveError(f"model {self.model}: the labels changed while the rollout was starting: retry")
            start = self._append(START, {"candidate": begun.version}, **begun.fields)
        log.info(
            "model %s: rollout of version %d begun (stable %d): %s",
            *(self.model, begun.version, labels.stable, start["plan"]),
        )
        return Progress(start=start)

    def _prepare(self, start: dict) -> None:
        """The model routed with no share, so that requests naming no version stay on stable; then, once every
        proxy replica reports that route, the candidate staged (loaded, labelled)."""
        version = start["candidate"]
        moves.set_route(self.config.routing_file, self.model, moves.step_route(start, 0, 0))
        if self._labels().candidate == version:
            return
        held_since = self.clock()
        why = self.ends.await_followers(routed_to(version))
        if why is not None:
            why = f"not every proxy replica reports the model's route within --wait {self.config.wait:g} s: {why}"
            self.ends.pause(start, None, "", self.clock() - held_since, why)
        c = self.config
        staged = CandidateConfig(c.config, self.model, version=version, server=c.server, wait=c.wait, tls=c.tls)
        stage_candidate(staged, self.server, rollout=start)

    def _resume(self, progress: Progress) -> Progress:
        """The rollout in the history is this one, stable has not moved under it, and it follows the same plan."""
        start, config = progress.start, self.config
        said = f"a rollout of model {self.model} version {progress.candidate} is in progress ({self.history})"
        if config.candidate is not None and config.candidate != progress.candidate:
            raise TrainserveError(f"{said}: expected --candidate {progress.candidate} to resume it, or --abort first")
        if config.plan != AUTO and start["plan"] != config.plan.text():
            raise TrainserveError(
                f"{said} with the plan {start['plan']!r}: expected the same --plan (or `auto`) to resume it"
            )
        self.plan = parse_plan(start["plan"])  # `auto` follows the plan it chose at the start
        labels = self._labels()
        if labels.stable != start["stable"] and not (progress.past_steps and labels.stable == progress.candidate):
            raise TrainserveError(
                f"{said}, but stable moved from version {start['stable']} to {labels.stable} since: expected --abort"
            )
        return progress

    # -- steps ---------------------------------------------------------------------------------------------

    def _enter(self, start: dict, index: int) -> tuple[int, float, dict]:
        """The step's origin of counts (the proxy's counters now, from Prometheus), recorded, then its routing;
        first, with --approve-before, a person's approval."""
        self.approvals.before(start, index)
        counters = self._ask(start, index, lambda: self._meter(start).origin())
        started = self._started = self.clock()
        self._append(STEP, start, step=index, words=self._words(index), started=started, counters=counters)
        self._route(start, index)
        log.info("model %s: step %d of %d: %s", self.model, index + 1, len(self.plan.steps), self._words(index))
        return index, started, counters

    def _route(self, start: dict, index: int) -> None:
        """The step's routing, once the labels are still the rollout's."""
        self._same_labels(start)
        plan = self.plan
        route = moves.step_route(start, plan.shadow_during(index), plan.canary_during(index))
        moves.set_route(self.config.routing_file, self.model, route)

    def _same_labels(self, start: dict) -> None:
        """LabelsMoved when `candidate` no longer names the rollout's version or `stable` moved (by hand)."""
        labels, version = self._labels(), start["candidate"]
        if labels.candidate != version:
            now = f"version {labels.candidate}" if labels.candidate is not None else "no version"
            raise LabelsMoved(f"labels: `candidate` names {now}, not version {version}: moved under the rollout")
        if labels.stable != start["stable"]:
            raise LabelsMoved(
                f"labels: stable moved from version {start['stable']} to {labels.stable} under the rollout"
            )

    def _watch(self, start: dict, index: int, started: float, counters: dict) -> str | None:
        """Look every --interval until the step advances (None) or fails (why, one line)."""
        step, plan = self.plan.steps[index], self.plan
        flips = start["flips"] and plan.shadow_during(index) > 0
        meter, offline = self._meter(start), start.get("offline") or {}
        held_since = None
        while True:
            self._same_labels(start)
            ended = self.clock() >= started + step.seconds
            look = self._ask(start, index, lambda state=counters: meter.look(state))
            changed, counters = look.state != counters, look.state
            found = analysis.checks(step, flips, look.counts, self.config.gate, offline)
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
            self.narrator.look(index, step, flips, offline, look, found, decision, self.clock() - started)
            if decision == analysis.ROLLBACK:
                return "; ".join(f"{c.name}: {c.said}" for c in found if c.result == analysis.FAIL)
            if decision == analysis.ADVANCE:
                return None
            if decision == analysis.HOLD:
                held_since = held_since if held_since is not None else self.clock()
                self._pause_if_held(start, index, held_since, said, undecided(found, look.unjudged))
            else:
                self.holds.cleared(f"its look decided {decision}")
            left = started + step.seconds - self.clock()
            self.sleep(min(self.config.interval, left) if left > 0 else self.config.interval)

    def _ask(self, start: dict, index: int, question: Callable[[], dict]) -> dict:
        """`question()` answered by Prometheus, waiting (holding) while it cannot be reached, up to --max-hold."""
        held_since = None
        while True:
            try:
                answer = question()
            except PrometheusUnreachable as exc:
                held_since = held_since if held_since is not None else self.clock()
                self._pause_if_held(start, index, held_since, str(exc))
                self.sleep(self.config.interval)
                continue
            if held_since is not None:
                self.holds.cleared("Prometheus answers again")
            return answer

    def _pause_if_held(self, start: dict, index: int, since: float, why: str, reason: str | None = None) -> None:
        """Pause once held past the step's own hold (a plan `auto` sized it), else --max-hold; said as HoldWords
        says it (`reason`: what a change of is worth a WARNING, by default `why`)."""
        hold = self.plan.steps[index].hold
        held = self.clock() - since
        limit = hold if hold is not None else self.config.max_hold
        self.holds.holding(index, self._words(index), reason or why, held, limit, detail=why)
        self.notifier.held(start, index, held, limit, why)
        if held >= limit:
            watched = self.clock() - self._started
            self.ends.pause(start, index, self._words(index), held, why, watched=watched)

    # -- measures ------------------------------------------------------------------------------------------

    def _meter(self, start: dict) -> Meter:
        return Meter(self.prometheus, self.model, start["candidate"], start["stable"], self.config.proxy_job)

    # -- helpers -------------------------------------------------------------------------------------------

    def _labels(self) -> Rollout:
        return Rollout.of(find_model(read_config(self.config.config), self.config.config, self.model))

    def _words(self, index: int) -> str:
        return self.plan.steps[index].words()

    def _append(self, kind: str, start: dict, **fields) -> dict:
        record = append_history(self.history, event(kind, self.model, start["candidate"], **fields))
        self.notifier.saw(record, start)
        return record

    def _only_controller(self) -> contextlib.AbstractContextManager[None]:
        """One controller per model and config: a second one is refused at once, not interleaved."""
        holder = f"another `trainserve rollout` of model {self.model}"
        return locked(self.config.config, f"rollout-{self.model}.lock", holder)
