"""The proxy's routing, followed from the routing file (trainserve.proxy.routing) and decided per request.

The file is read at start and then by a thread every `--routing-poll-seconds`, as TF Serving polls its model
config: a changed file that checks out replaces the routing at once for every later request; one that does not is
refused in one log line (once per content), `routing_refused` is 1, and the running routing is kept (none, when
the proxy starts on it), as TF Serving keeps serving after a bad config. A file that is removed ends the routing.
Each request addressed to `stable` (or, for a routed model, to no version and no label: sent as `stable`) draws
once for the canary share (or hashes its sticky header) and once for the shadow share; a request answered by the
candidate is never shadowed.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainserve.proxy.routing import NO_ROUTING, STABLE_LABEL, Routing, RoutingError, parse_routing, routing_bytes

log = logging.getLogger(__name__)

UNREADABLE = b"unreadable"  # what was seen of a file that could not be read
STABLE, CANARY, DIRECT = "stable", "canary", "direct"  # the `route` label of the proxy's request counts


@dataclass(frozen=True)
class Decision:
    """Where one request goes: `route`, the version it is rewritten to (canary), the version it is shadowed to, and
    whether it named no version and no label and is sent as a `stable` request (`as_stable`)."""

    route: str
    version: int | None = None
    shadow: int | None = None
    as_stable: bool = False


PASS = Decision(DIRECT)


class Router:
    """The routing in force (`routing`), reloaded from `path` by `poll()`; `decide` is called per request."""

    def __init__(self, path: Path | None, uniform: Callable[[], float] | None = None):
        self.path = Path(path) if path else None
        self.uniform = uniform or random.Random().random
        self.routing: Routing = NO_ROUTING
        self.refused: str | None = None  # why the file on disk is not followed, while it is not
        self.reloads = {"applied": 0, "refused": 0}
        self._seen: bytes | None = None  # digest of the content last applied or refused
        self._stop = threading.Event()
        self.poll()  # a bad file at start is refused as at any poll: the proxy starts with no routing, and says so

    def _read(self) -> bytes | None:
        """The file's bytes, read once (what is parsed is what is remembered as seen); None when absent."""
        try:
            return routing_bytes(self.path)
        except RoutingError:
            self._seen = UNREADABLE
            raise

    def poll(self) -> bool:
        """Read the file once; returns whether the routing changed."""
        if self.path is None:
            return False
        seen = self._seen
        try:
            text = self._read()
            if _digest(text) == seen:
                return False
            self._seen = _digest(text)
            routing = NO_ROUTING if text is None else parse_routing(text, f"routing file {self.path}")
        except RoutingError as exc:
            if seen == UNREADABLE:  # logged once, not at every poll, until it reads again
                return False
            self.refused = str(exc)
            self.reloads["refused"] += 1
            log.error("proxy: %s; keeping the routing in force (%s)", exc, describe(self.routing))
            return False
        self.refused = None
        self.reloads["applied"] += 1
        changed, self.routing = routing != self.routing, routing
        log.info("proxy: routing from %s: %s", self.path, describe(routing))
        return changed

    def watch(self, every_s: float) -> None:
        """Poll from a daemon thread until `stop()`."""
        if self.path is None:
            return

        def loop() -> None:
            while not self._stop.wait(every_s):
                try:
                    self.poll()
                except Exception:  # a poll must never end the watching
                    log.exception("proxy: routing poll failed")

        threading.Thread(target=loop, name="proxy-routing", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def decide(self, model: str, label: str | None, sticky: Callable[[str], str | None]) -> Decision:
        """`label`: the request's version label, "" when it names neither a version nor a label, None when it names
        a version. `sticky(header)`: the request's value of a header, or None."""
        route = self.routing.route(model) if label in (STABLE_LABEL, "") else None
        if route is None:
            return PASS
        value = sticky(route.sticky_header) if route.sticky_header else None
        if route.canary_share(model, value, self.uniform()):
            return Decision(CANARY, route.candidate)
        shadow = route.candidate if route.shadow_percent and self.uniform() * 100 < route.shadow_percent else None
        return Decision(STABLE, None, shadow, as_stable=label == "")


def _digest(text: bytes | None) -> bytes | None:
    return None if text is None else hashlib.sha256(text).digest()


def describe(routing: Routing) -> str:
    if not routing.models:
        return "none"
    return "; ".join(
        f"{model}: candidate {r.candidate}, shadow {r.shadow_percent:g} %, canary {r.canary_percent:g} %"
        + (f" sticky by {r.sticky_header}" if r.sticky_header else "")
        for model, r in sorted(routing.models.items())
    )
