"""The bake: after the promotion (stable = the rollout's version, previous = the stable it replaced, both loaded),
the controller keeps judging the new stable for the START record's `bake` seconds (trainserve.rollout.bake_size)
and moves stable back to previous on a failure (trainserve.rollout.ends: `back_to_previous`).

    route    the model routed with previous named and no canary share: every client is answered by stable; with
             the plan's last shadow share, stable's answered requests are also copied to previous and the answers
             compared (the shadow the other way), which counts previous's copies and the flips
    counts   measure's, with `candidate` = previous and `stable` = the new stable, from the bake's start; the
             latency threshold is the last step's (previous's p99 before the switch), kept
    checks   trainserve.rollout.bake_checks, every --interval; a failure rolls back at once; the bake ends when
             its time is up, whatever the checks still wait for (the version passed its steps: the bake looks for
             a failure, it does not have to show a pass), and an end that finds Prometheus unreachable ends it too
    records  BAKE (its start: the baseline, the counting state, previous), a CHECK per look (step = the plan's
             `100%`), then BAKED (ended, the version kept) or ROLLBACK / ROLLED-BACK; a controller killed in the
             bake resumes it (RESUMED) with its counts and the time it had left
"""

from __future__ import annotations

import logging
from dataclasses import asdict

from trainserve.proxy.routing import ModelRoute
from trainserve.rollout import moves
from trainserve.rollout.bake_checks import bake_checks, baseline_of
from trainserve.rollout.config_file import history_path
from trainserve.rollout.ends import Ends, Outcome
from trainserve.rollout.history import read_history
from trainserve.rollout.look_words import check_words
from trainserve.rollout.measure import Meter
from trainserve.rollout.plan import parse_plan
from trainserve.rollout.progress import BAKE, BAKED, CHECK, RESUMED, ROLLBACK, Progress, in_progress
from trainserve.rollout.prometheus import Prometheus, PrometheusUnreachable
from trainserve.rollout.report.write import written
from trainserve.rollout.sizing.choose import hours

log = logging.getLogger("trainserve.rollout.controller")
WATCH, ROLLED, ENDED = "watch", "rollback", "baked"


def bake_seconds(start: dict) -> float:
    """The bake the START record set (0: none; a rollout begun before the bake has none)."""
    return float((start.get("bake") or {}).get("seconds") or 0.0)


class Bake:
    """The bake of one rollout, moved and recorded through the rollout's `ends` (its config, model, Prometheus,
    labels, history, clock and sleep)."""

    def __init__(self, ends: Ends):
        self.ends = ends

    def after_promotion(self, start: dict, promoted: Outcome) -> Outcome:
        """The bake, begun once the promotion is recorded, against previous's counts over the last step (its
        counting state as the history keeps it)."""
        if not bake_seconds(start) or not promoted.promoted:
            return promoted
        previous = self.ends.labels().previous
        if previous is None:
            return self._ended(start, "no previous version kept to judge the new stable against: not baked")
        last = in_progress(read_history(history_path(self.ends.config.config)), self._model)
        baseline = baseline_of(last.counters if last else {}, last.step if last else None)
        # Its first look sees every replica for the first time: where the bake's counts start (measure, counting).
        state = {"le": None, **(baseline["threshold"] or {}), "seen": {}, "counts": {}}
        started, words = self.ends.clock(), self._words(start)
        fields = {"words": words, "started": started, "counters": state, "baseline": baseline}
        self.ends.append(BAKE, start, step=self._index(start), previous=previous, **fields)
        self._route(start, previous)
        log.info("model %s: %s begun, previous version %d kept loaded and judged against", self._model, words, previous)
        return self._watch(start, previous, started, state, baseline)

    def resume(self, progress: Progress) -> Outcome:
        """A controller run again after the promotion: the bake begun, resumed with its counts, or finished."""
        start, bake = progress.start, progress.baking
        if progress.pending is not None and progress.pending["event"] == ROLLBACK:
            return self.ends.back_to_previous(start, progress.pending["said"])
        promoted = Outcome(True, f"model {self._model}: promoted, baking")
        if bake is None:
            return self.after_promotion(start, promoted)
        started, state, previous = progress.step_started, progress.counters, bake["previous"]
        self.ends.append(RESUMED, start, step=self._index(start), after="a stop", started=started, counters=state)
        self._route(start, previous)
        left = max(0.0, started + bake_seconds(start) - self.ends.clock())
        log.info("model %s: resuming the bake with its counts, %.0f s left", self._model, left)
        return self._watch(start, previous, started, state, bake["baseline"])

    def abort(self, progress: Progress) -> Outcome:
        """--abort during the bake: stable back to previous, as a failure moves it (the replicas confirmed on the
        Prometheus the START record names where --prometheus is not given)."""
        if self.ends.prometheus is None and progress.start.get("prometheus"):
            self.ends.prometheus = Prometheus(progress.start["prometheus"])
        said = f"aborted during the bake: {self.ends.config.reason}"
        self.ends.append(ROLLBACK, progress.start, step=self._index(progress.start), said=said)
        return self.ends.back_to_previous(progress.start, said)

    def _watch(self, start: dict, previous: int, started: float, state: dict, baseline: dict) -> Outcome:
        """Look every --interval until a check fails (rolled back) or the bake's time is up (ended)."""
        ends, meter, seconds = self.ends, self._meter(start, previous), bake_seconds(start)
        while True:
            stable = ends.labels().stable
            if stable != start["candidate"]:
                return self._ended(start, f"stable moved to version {stable} under the bake: nothing left to judge")
            over = ends.clock() >= started + seconds
            try:
                look = meter.look(state)
            except PrometheusUnreachable as exc:
                if over:
                    return self._ended(start, f"its time is up; its last look found {exc}")
                log.warning("model %s: bake: %s", self._model, exc)
                ends.sleep(ends.config.interval)
                continue
            changed, state = look.state != state, look.state
            decision, said = self._judged(start, look, baseline, state if changed else None, over)
            if decision == ROLLED:
                ends.append(ROLLBACK, start, step=self._index(start), said=said)
                return ends.back_to_previous(start, said)
            if decision == ENDED:
                return self._ended(start, "its time is up with no check failed")
            left = started + seconds - ends.clock()
            ends.sleep(min(ends.config.interval, left) if left > 0 else ends.config.interval)

    def _judged(self, start: dict, look, baseline: dict, state: dict | None, over: bool) -> tuple[str, str]:
        """One look's checks, recorded and said: the decision and, for a rollback, why."""
        gate, flips = self.ends.config.gate, start["flips"] and self._shadow(start) > 0
        found = bake_checks(look.counts, baseline, gate, start.get("offline") or {}, flips)
        failed = "; ".join(f"{c.name}: {c.said}" for c in found if c.result == "fail")
        decision = ROLLED if failed else ENDED if over else WATCH
        self.ends.append(
            CHECK,
            start,
            step=self._index(start),
            bake=True,
            counts=look.counts,
            checks=[asdict(c) for c in found],
            decision=decision,
            **({"state": state} if state is not None else {}),
            **({"unjudged": look.unjudged} if look.unjudged else {}),
        )
        words = "; ".join(check_words(c, None, 0.0) for c in found)
        log.info("model %s: bake (%s): %s", self._model, decision, words)
        return decision, failed

    def _ended(self, start: dict, said: str) -> Outcome:
        """The bake over with the version kept: the route removed, BAKED recorded, the report written again."""
        moves.clear_route(self.ends.config.routing_file, self._model)
        labels = self.ends.labels()
        self.ends.append(BAKED, start, said=said, after=labels.labels())
        log.info("model %s: bake ended: %s", self._model, said)
        report = written(history_path(self.ends.config.config), self._model)
        return Outcome(True, f"model {self._model}: {labels.describe()} (baked: {said})", report)

    def _route(self, start: dict, previous: int) -> None:
        """Previous named, no canary share, the plan's last shadow share copied to it."""
        route = ModelRoute(previous, self._shadow(start), 0.0, start.get("sticky_header"), start.get("sticky_salt"))
        moves.set_route(self.ends.config.routing_file, self._model, route)

    def _meter(self, start: dict, previous: int) -> Meter:
        return Meter(self.ends.prometheus, self._model, previous, start["candidate"], self.ends.config.proxy_job)

    def _shadow(self, start: dict) -> float:
        plan = parse_plan(start["plan"])
        return plan.shadow_during(len(plan.steps) - 1)

    def _index(self, start: dict) -> int:
        return len(parse_plan(start["plan"]).steps) - 1

    def _words(self, start: dict) -> str:
        return f"bake {hours(bake_seconds(start))}"

    @property
    def _model(self) -> str:
        return self.ends.model
