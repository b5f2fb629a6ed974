"""Whether the server has room for a shadow copy now, read from the clients' own latency: a copy is shed while the
median latency of the last `--shadow-shed-latency-window` shadowed client calls exceeds, by more than
`--shadow-shed-latency-margin` (a fraction), the median of the last QUIET_CALLS calls that no copy overlapped.

Why latency and why quiet calls: a copy costs the client only by slowing the calls it overlaps on the server, so
the clients' latency is the cost itself, and calls that no copy touched are what that latency is without the
shadow. The baseline follows the server: shedding makes quiet calls, so a server slowed by its clients (or by
anything else) gets a slower baseline within QUIET_CALLS quiet calls, and copies resume; until MIN_QUIET calls were
quiet nothing is shed for latency. A call answered slowly sheds the copies offered just after it, the copies of a
burst, which are those that would delay the calls that follow.

Used on the proxy's event loop only; `clock` (seconds) is injected so that tests decide what overlapped what.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Callable

QUIET_CALLS = 256  # the baseline's window: a few seconds of traffic at 100 calls/s
MIN_QUIET = 16  # quiet calls needed before latency sheds anything


class Headroom:
    """The clients' calls in (`client_call`), the copies out and back (`copy_sent`, `copy_back`); `inflated()`
    says whether the clients' recent latency is over the quiet baseline by more than the margin."""

    def __init__(self, margin: float, window: int, clock: Callable[[], float] = time.perf_counter):
        self.margin, self.clock = margin, clock
        self.recent: deque[float] = deque(maxlen=window)
        self.quiet: deque[float] = deque(maxlen=QUIET_CALLS)
        self._quiet_sorted: list[float] = []  # self.quiet, kept sorted for the median
        self.copies_out, self.last_copy_back = 0, float("-inf")

    def client_call(self, latency: float) -> None:
        """A client's call answered `latency` seconds after it began, now."""
        self.recent.append(latency)
        if self.copies_out == 0 and self.last_copy_back <= self.clock() - latency:
            if len(self.quiet) == self.quiet.maxlen:
                del self._quiet_sorted[bisect.bisect_left(self._quiet_sorted, self.quiet[0])]
            self.quiet.append(latency)
            bisect.insort(self._quiet_sorted, latency)

    def copy_sent(self) -> None:
        self.copies_out += 1

    def copy_back(self) -> None:
        """A copy's call ended (answered or not): the server no longer computes it."""
        self.copies_out -= 1
        self.last_copy_back = self.clock()

    def baseline(self) -> float | None:
        """The quiet calls' median latency (s), None before MIN_QUIET of them."""
        if len(self._quiet_sorted) < MIN_QUIET:
            return None
        return median(self._quiet_sorted)

    def inflated(self) -> bool:
        baseline = self.baseline()
        return baseline is not None and median(sorted(self.recent)) > baseline * (1 + self.margin)


def median(ordered: list[float]) -> float:
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
