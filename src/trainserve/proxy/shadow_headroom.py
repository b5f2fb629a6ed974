"""Whether the server has room for a shadow copy now, read from the clients' own latency. Each shadowed client call
is compared with its kind's quiet latency (calls of the same model and request size within a factor of 2): the
lower of two medians of the last QUIET_CALLS calls, those made while the model's route had no shadow share
(`unshadowed_call`) and the shadowed calls that none of this proxy's copies overlapped. A copy is shed while the
median of the last `--shadow-shed-latency-window` slowdowns (latency / quiet latency) exceeds
1 + `--shadow-shed-latency-margin`.

Why latency and why quiet calls: a copy costs the client only by slowing the calls it overlaps on the server, so
the clients' latency is the cost itself, and calls that no copy touched are what that latency is without the
shadow. By kind, so that a batch of 256 is not judged against batches of 1.

Why the calls without a shadow: with N proxy replicas in front of one server, a call that none of this replica's
copies overlapped may still meet the others' copies, so each replica's own quiet calls take as long as the
shadowed ones (2x, say) and none sheds. Every replica follows the same routing file, so while the route has no
shadow share no replica sends a copy: those calls are quiet for all of them. One enters the baseline `skew`
seconds after it ended (a routing poll plus a copy's deadline: another replica may see the shadow start up to a
poll sooner, and copies end up to their deadline after it stops), and a shadowed call of its kind discards those
not yet in. So while shadowing the baseline follows the server downward (this replica's quiet calls), not upward.

Limits: a server slowed for good during the shadow (by its clients, say) keeps the copies shed until the route's
shadow ends; a replica started while the route shadows has only its own quiet calls, which other replicas' copies
may slow (the rule before replicas); another model's shadow on the same server slows these calls too. A kind with
fewer than MIN_QUIET calls in both adds no slowdown. A call answered slowly sheds the copies offered just after
it, the copies of a burst, which would delay the calls that follow.

Used on the proxy's event loop only; `clock` (seconds) is injected so that tests decide what overlapped what.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Callable

QUIET_CALLS = 256  # a kind's baseline: a few seconds of traffic at 100 calls/s
MIN_QUIET = 16  # quiet calls of a kind before its calls are judged
Kind = tuple[str, int]


def kind(model: str, request_bytes: int) -> Kind:
    """Calls judged against one baseline: one model's requests within a factor of 2 in size."""
    return model, request_bytes.bit_length()


class QuietLatency:
    """The latencies of the last QUIET_CALLS quiet calls of one kind, kept sorted too for the median."""

    def __init__(self) -> None:
        self.latencies: deque[float] = deque(maxlen=QUIET_CALLS)
        self.ordered: list[float] = []

    def add(self, latency: float) -> None:
        if len(self.latencies) == QUIET_CALLS:
            del self.ordered[bisect.bisect_left(self.ordered, self.latencies[0])]
        self.latencies.append(latency)
        bisect.insort(self.ordered, latency)

    def median(self) -> float | None:
        """None before MIN_QUIET calls."""
        return median(self.ordered) if len(self.ordered) >= MIN_QUIET else None


class Headroom:
    """The clients' calls in (`client_call`, `unshadowed_call`), the copies out and back (`copy_sent`,
    `copy_back`); `inflated()` says whether the clients' recent slowdown is over 1 + the margin."""

    def __init__(self, margin: float, window: int, skew: float = 0.0, clock: Callable[[], float] = time.perf_counter):
        self.margin, self.skew, self.clock = margin, skew, clock
        self.recent: deque[float] = deque(maxlen=window)  # slowdowns: latency / its kind's quiet latency
        self.quiet: dict[Kind, QuietLatency] = {}  # shadowed calls none of this proxy's copies overlapped
        self.unshadowed: dict[Kind, QuietLatency] = {}  # calls while the route had no shadow share
        self.pending: dict[Kind, deque[tuple[float, float]]] = {}  # unshadowed (ended, latency), not `skew` old
        self.shadowed_at: dict[Kind, float] = {}  # each kind's last shadowed call
        self.copies_out, self.last_copy_back = 0, float("-inf")

    def client_call(self, of_kind: Kind, latency: float) -> None:
        """A shadowed client call of `of_kind` answered `latency` seconds after it began, now."""
        now = self.clock()
        self._settle(of_kind, now)
        self.pending.pop(of_kind, None)  # within `skew` of the shadow: another replica's copies may have met them
        self.shadowed_at[of_kind] = now
        quiet_latency = self.baseline(of_kind)
        if quiet_latency:
            self.recent.append(latency / quiet_latency)
        own = self.quiet.setdefault(of_kind, QuietLatency())
        if self.copies_out == 0 and self.last_copy_back <= now - latency:
            own.add(latency)

    def unshadowed_call(self, of_kind: Kind, latency: float) -> None:
        """A client call of `of_kind`, whose model's route has no shadow share, answered `latency` s after it began,
        now: it enters the kind's baseline `skew` s on, unless it began within `skew` of the last shadowed call."""
        now = self.clock()
        if now - latency < self.shadowed_at.get(of_kind, float("-inf")) + self.skew:
            return
        self.pending.setdefault(of_kind, deque()).append((now, latency))
        self._settle(of_kind, now)

    def _settle(self, of_kind: Kind, now: float) -> None:
        """The kind's pending unshadowed calls that ended `skew` seconds ago or more enter its baseline."""
        pending = self.pending.get(of_kind)
        while pending and pending[0][0] <= now - self.skew:
            self.unshadowed.setdefault(of_kind, QuietLatency()).add(pending.popleft()[1])

    def baseline(self, of_kind: Kind) -> float | None:
        """The kind's quiet latency: the lower of its two medians; None before MIN_QUIET calls in either."""
        medians = [q[of_kind].median() for q in (self.unshadowed, self.quiet) if of_kind in q]
        return min((m for m in medians if m), default=None)

    def copy_sent(self) -> None:
        self.copies_out += 1

    def copy_back(self) -> None:
        """A copy's call ended (answered or not): the server no longer computes it."""
        self.copies_out -= 1
        self.last_copy_back = self.clock()

    def inflated(self) -> bool:
        return bool(self.recent) and median(sorted(self.recent)) > 1 + self.margin


def median(ordered: list[float]) -> float:
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
