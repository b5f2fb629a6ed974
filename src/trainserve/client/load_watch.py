"""A wait for a version to load, as a person follows it (a large SavedModel takes seconds to minutes): what it
waits for, in one line at its start; each new state the server reports, and every REPEAT_S seconds the state it
still reports, in one line; on a terminal a bar over the seconds --wait allows; and how long the load took.

    waiting up to 600 s (--wait) for localhost:8500 to load model digits version 3
    model digits version 3 after 0.3 s: state LOADING
    model digits version 3 AVAILABLE after 17.2 s
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from trainserve.terminal import progress_bar

log = logging.getLogger(__name__)
REPEAT_S = 10.0  # off a terminal, the line that says the wait goes on


class LoadWatch:
    """Told each look of one wait (`__call__`), then its end (`close`)."""

    def __init__(self, what: str, server: str, wait_s: float, clock: Callable[[], float] = time.monotonic, show=None):
        self.what, self.clock = what, clock
        self.started = self.last_line = clock()
        self.said: str | None = None
        log.info("waiting up to %g s (--wait) for %s to load %s", wait_s, server, what)
        self.bar = progress_bar(round(wait_s), "s", f"loading {what}", show)

    def __call__(self, version: int | None, said: str) -> None:
        now = self.clock()
        elapsed = now - self.started
        if version is None and (said != self.said or now - self.last_line >= REPEAT_S):
            log.info("%s after %.1f s: %s", self.what, elapsed, said)
            self.said, self.last_line = said, now
        self.bar.n = min(round(elapsed), self.bar.total)
        self.bar.set_postfix_str(said, refresh=True)

    def close(self, loaded: bool) -> None:
        """The bar gone; `loaded`: the line saying how long the load took."""
        self.bar.close()
        if loaded:
            log.info("%s AVAILABLE after %.1f s", self.what, self.clock() - self.started)
