"""How a rollout ends or stops, each move leaving the model's route safe before the next one depends on it:

rollback  the route held (no canary share, no shadow); once every proxy replica reports it (Prometheus, within
          --wait; trainserve.rollout.follow) the `candidate` label dropped; once the server no longer serves the
          version, the model's route removed (until then a request naming no version is answered by stable).
          A step that cannot be confirmed leaves the rollback pending (exit 75, the label kept): a rerun
          finishes it. A rollout that never gave a canary share has nothing to wait for.
promote   the report checked against the START record's SHA-256 (changed since: rolled back instead), then
          promoted as `trainserve promote` does, then the route removed
pause     the route held, the controller stops (exit 75); a rerun resumes the step with its routing and its counts
back      a promoted version that failed its bake (trainserve.rollout.bake), or --abort during it: stable back to
          previous as `trainserve rollback` moves it, in two writes so that no client call fails: first the two
          labels swapped (both versions loaded; the server confirms `stable`), then, once every proxy replica
          reports a route with no canary share (none sends a request to the version by number), the version
          unloaded (previous unset, as a rollback leaves it) and the route removed. A replica that cannot be
          confirmed leaves the version loaded as previous, the rollback pending (exit 75): a rerun finishes it

Each end, once recorded, writes the decision report beside the history (trainserve.rollout.report; a promotion
with a bake to follow: at the bake's end); one that cannot be written is logged, and the decision stands.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainserve.errors import TrainserveError
from trainserve.files import locked
from trainserve.rollout import moves
from trainserve.rollout.config import PromoteConfig
from trainserve.rollout.config_file import find_model, history_path, read_config, write_config
from trainserve.rollout.follow import FOLLOW_POLL_S, Judge, await_followers, no_canary
from trainserve.rollout.history import read_history
from trainserve.rollout.labels import STABLE, Rollout, apply_rollout
from trainserve.rollout.plan import parse_plan
from trainserve.rollout.progress import PAUSED, PROMOTED, ROLLBACK, ROLLED_BACK, in_progress
from trainserve.rollout.prometheus import Prometheus
from trainserve.rollout.report.write import written
from trainserve.rollout.rollout_config import RolloutConfig
from trainserve.rollout.steps import ReportChanged, Server, promote


class RolloutPaused(TrainserveError):
    """Stopped with the route held on stable (no canary share, no shadow); run the controller again to resume."""

    exit_code = 75  # EX_TEMPFAIL: try again later


class RollbackPending(TrainserveError):
    """A rollback that could not confirm its next move: the label kept, the route held; a rerun finishes it."""

    exit_code = 75


@dataclass(frozen=True)
class Outcome:
    promoted: bool
    said: str
    report: Path | None = None  # the decision report (None: it could not be written)


class Ends:
    """The ends of one model's rollout. `labels()` reads the config now; `append(kind, start, **fields)` writes the
    history; `clock` (epoch seconds) and `sleep` are time's, or a test's."""

    def __init__(
        self,
        config: RolloutConfig,
        model: str,
        prometheus: Prometheus | None,
        server: Server | None,
        labels: Callable[[], Rollout],
        append: Callable[..., dict],
        clock: Callable[[], float],
        sleep: Callable[[float], None],
    ):
        self.config, self.model, self.prometheus, self.server = config, model, prometheus, server
        self.labels, self.append, self.clock, self.sleep = labels, append, clock, sleep

    # -- rollback ------------------------------------------------------------------------------------------

    def abort(self, start: dict) -> Outcome:
        """--abort: the replicas confirmed on --prometheus, else on the Prometheus the START record names (an abort
        needs only the model and --reason); refused before anything moves when the label could only be dropped
        unconfirmed."""
        if self.prometheus is None and start.get("prometheus"):
            self.prometheus = Prometheus(start["prometheus"])
        if self.prometheus is None and self._needs_confirming(start):
            raise TrainserveError(
                f"--abort of model {self.model} version {start['candidate']}, which had a canary share: expected "
                "--prometheus URL (its START record names none), to confirm that every proxy replica left it before "
                "its label is dropped"
            )
        said = f"aborted: {self.config.reason}"
        self.append(ROLLBACK, start, said=said)
        return self.rolled_back(start, said)

    def rolled_back(self, start: dict, said: str) -> Outcome:
        version, routing = start["candidate"], self.config.routing_file
        moves.hold_route(routing, self.model)
        if self._needs_confirming(start):
            why = self.await_followers(no_canary)
            if why is not None:
                raise RollbackPending(
                    f"rollback of model {self.model} version {version} pending: the route is held on stable, but "
                    f"not every proxy replica reports it within --wait {self.config.wait:g} s ({why}); the "
                    "`candidate` label is kept so that no request reaches an unloaded version: run the same "
                    "command again to finish the rollback"
                )
        before, after = moves.drop_candidate(self.config.config, self.model, version)
        self._await_unloaded(version, after)
        moves.clear_route(routing, self.model)
        self.append(ROLLED_BACK, start, said=said, before=before.labels(), after=after.labels())
        return Outcome(False, f"model {self.model} version {version}: {said}; {after.describe()}", self._report())

    def _needs_confirming(self, start: dict) -> bool:
        """Whether a replica may still send requests to the candidate: it is labelled, and a step gave it a share."""
        if self.labels().candidate != start["candidate"]:
            return False
        progress = in_progress(read_history(history_path(self.config.config)), self.model)
        plan = parse_plan(start["plan"])
        return progress is not None and any(plan.canary_during(i) > 0 for i in progress.entered)

    def _await_unloaded(self, version: int, labels: Rollout) -> None:
        """Until the server no longer serves `version` (not waited without --server, nor for a labelled version)."""
        if self.server is None or version in labels.versions():
            return
        try:
            self.server.wait_unloaded(self.model, version, self.config.wait)
        except TrainserveError as exc:
            raise RollbackPending(
                f"rollback of model {self.model} version {version} pending: its label is dropped, but {exc}; the "
                "model's route stays (requests naming no version answered by stable): run the same command again"
            ) from None

    def await_followers(self, judge: Judge) -> str | None:
        """Wait, within --wait, until every proxy replica reports the routing just written (None), else why not."""
        c = self.config
        poll_s = min(FOLLOW_POLL_S, c.interval)
        return await_followers(self.prometheus, c.proxy_job, self.model, judge, c.wait, self.clock, self.sleep, poll_s)

    # -- a failed bake -------------------------------------------------------------------------------------

    def back_to_previous(self, start: dict, said: str) -> Outcome:
        """The promoted version (the rollout's candidate) replaced by previous as stable (see the module's
        docstring); each write is skipped where an earlier run made it."""
        version, before = start["candidate"], self.labels()
        if before.stable == version and before.previous is None:
            raise TrainserveError(
                f"model {self.model}: version {version} is stable with no previous version labelled (moved by hand?): "
                "nothing to move back to; expected `previous` labelled, then the same command"
            )
        if before.stable == version:
            self._relabel(Rollout(before.previous, version, before.candidate))
            if self.server is not None:
                self.server.wait_label(self.model, STABLE, before.previous, self.config.wait)
        moves.hold_route(self.config.routing_file, self.model)
        if self.labels().previous == version:
            why = self.await_followers(no_canary)
            if why is not None:
                raise RollbackPending(
                    f"model {self.model}: stable is back on previous, but version {version} stays loaded as previous: "
                    f"not every proxy replica reports a route with no canary share within --wait "
                    f"{self.config.wait:g} s ({why}): run the same command again to unload it"
                )
            now = self.labels()
            after = self._relabel(Rollout(now.stable, None, now.candidate))
            self._await_unloaded(version, after)
        moves.clear_route(self.config.routing_file, self.model)
        after = self.labels()
        self.append(ROLLED_BACK, start, said=said, before=before.labels(), after=after.labels())
        return Outcome(False, f"model {self.model} version {version}: {said}; {after.describe()}", self._report())

    def _relabel(self, after: Rollout) -> Rollout:
        """The model's labels (and so its versions) set to `after`, under the config's lock."""
        path = self.config.config
        with locked(path):
            served = read_config(path)
            apply_rollout(find_model(served, path, self.model), after)
            write_config(path, served)
        return after

    # -- promote -------------------------------------------------------------------------------------------

    def promoted(self, start: dict) -> Outcome:
        """Promote on the report the rollout began on; a report rewritten since rolls back instead."""
        labels = self.labels()
        if labels.stable != start["candidate"]:
            c = self.config
            promotion = PromoteConfig(
                c.config, Path(start["report"]), c.replay, server=c.server, wait=c.wait, tls=c.tls
            )
            try:
                promote(promotion, self.server, rollout=start)
            except ReportChanged as exc:
                self.append(ROLLBACK, start, said=str(exc))
                return self.rolled_back(start, str(exc))
            labels = self.labels()
        moves.clear_route(self.config.routing_file, self.model)
        self.append(PROMOTED, start, after=labels.labels())
        baking = (start.get("bake") or {}).get("seconds")  # the rollout ends after its bake: the report then
        return Outcome(True, f"model {self.model}: {labels.describe()}", None if baking else self._report())

    # -- pause ---------------------------------------------------------------------------------------------

    def pause(self, start: dict, index: int | None, words: str, held: float, why: str, **fields) -> None:
        """Hold the route on stable, record the pause (with `fields`: the step's time watched), and stop
        (RolloutPaused)."""
        moves.hold_route(self.config.routing_file, self.model)
        self.append(PAUSED, start, step=index, said=why, held_seconds=held, **fields)
        where = f"at step {index + 1} ({words})" if index is not None else "before its first step"
        report = self._report()
        raise RolloutPaused(
            f"rollout of model {self.model} version {start['candidate']} paused {where} after holding {held:.0f} s: "
            f"{why}; the route is held on stable (no canary share, no shadow): run the same command again to resume "
            f"the step with its counts, or --abort --reason TEXT{f'; decision report: {report}' if report else ''}"
        )

    # -- the decision report -------------------------------------------------------------------------------

    def _report(self) -> Path | None:
        """The decision report, written beside the history once an end is recorded (None: it could not be)."""
        return written(history_path(self.config.config), self.model)
