"""Whether the server has room for a shadow copy now, read from the clients' own latency. Each shadowed client call
is compared with its kind's quiet latency: the median of the last QUIET_CALLS calls of the same model and request
size (within a factor of 2) that no copy overlapped. A copy is shed while the median of the last
`--shadow-shed-latency-window` of these slowdowns (latency / quiet latency) exceeds 1 + `--shadow-shed-latency-margin`.

Why latency and why quiet calls: a copy costs the client only by slowing the calls it overlaps on the server, so
the clients' latency is the cost itself, and calls that no copy touched are what that latency is without the
shadow. By kind, so that a batch of 256 is not judged against batches of 1. The baseline follows the server:
shedding makes quiet calls, so a server slowed by its clients (or by anything else) gets a slower baseline within
QUIET_CALLS quiet calls, and copies resume; a kind with fewer than MIN_QUIET quiet calls adds no slowdown. A call
answered slowly sheds the copies offered just after it, the copies of a burst, which would delay the calls that
follow.

Used on the proxy's event loop only; `clock` (seconds) is injected so that tests decide what overlapped what.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Callable

QUIET_CALLS = 256  # a kind's baseline: a few seconds of traffic at 100 calls/s
MIN_QUIET = 16  # quiet calls of a kind before its calls are judged


def kind(model: str, request_bytes: int) -> tuple[str, int]:
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
    """The clients' calls in (`client_call`), the copies out and back (`copy_sent`, `copy_back`); `inflated()`
    says whether the clients' recent slowdown is over 1 + the margin."""

    def __init__(self, margin: float, window: int, clock: Callable[[], float] = time.perf_counter):
        self.margin, self.clock = margin, clock
        self.recent: deque[float] = deque(maxlen=window)  # slowdowns: latency / its kind's quiet latency
        self.quiet: dict[tuple[str, int], QuietLatency] = {}  # by kind(); only routed models are shadowed
        self.copies_out, self.last_copy_back = 0, float("-inf")

    def client_call(self, of_kind: tuple[str, int], latency: float) -> None:
        """A client's call of `of_kind` answered `latency` seconds after it began, now."""
        baseline = self.quiet.setdefault(of_kind, QuietLatency())
        quiet_latency = baseline.median()
        if quiet_latency:
            self.recent.append(latency / quiet_latency)
        if self.copies_out == 0 and self.last_copy_back <= self.clock() - latency:
            baseline.add(latency)

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
