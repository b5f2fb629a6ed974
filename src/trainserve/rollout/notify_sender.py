"""Where a rollout's notifications go (--notify URL[,URL]) and how they get there without the controller waiting.

A receiver is an http(s) URL; `alertmanager+https://...` or `generic+https://...` picks its format, else
--notify-format does. The `Sender` posts from one background thread fed by a bounded queue: a POST has a short
timeout and a few attempts (a refused connection, a timeout or a 5xx is tried again; a 4xx is the receiver
saying no, not tried again), a full queue drops the document, and `close()` waits a couple of seconds at most
for what is still queued. Whatever was not delivered by then is counted as failed, never retried later: a
notification is news, and a decision never waits for it.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import queue
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from trainserve import __version__

log = logging.getLogger(__name__)

Format = Literal["generic", "alertmanager"]
FORMATS: tuple[Format, ...] = ("generic", "alertmanager")
TIMEOUT_S = 2.0  # one POST
ATTEMPTS = 3  # per document and receiver
BACKOFF_S = 0.5  # before the 2nd attempt, doubled before each next
CAPACITY = 64  # documents waiting; a controller writes one per decision, so only a stuck receiver fills it
FLUSH_S = 2.0  # the most the controller's exit waits for what is still queued


@dataclass(frozen=True)
class Receiver:
    url: str
    format: Format | None = None  # None: --notify-format's


def parse_receivers(text: str) -> tuple[Receiver, ...]:
    """`https://a/hook,alertmanager+http://b/api` -> receivers; anything else names what was expected."""
    found = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        prefix, plus, rest = item.partition("+")
        kind, url = (prefix, rest) if plus and prefix in FORMATS else (None, item)
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise argparse.ArgumentTypeError(
                f"{item!r}: expected an http(s) URL, optionally prefixed alertmanager+ or generic+ (its format)"
            )
        found.append(Receiver(url, kind))
    if not found:
        raise argparse.ArgumentTypeError(f"{text!r}: expected one or more http(s) URLs separated by commas")
    return tuple(found)


class Refused(Exception):
    """The receiver answered 4xx: trying again would get the same answer."""


def post_json(url: str, body: bytes, timeout: float) -> None:
    """One POST of a JSON body; raises on no answer, a timeout, or a status that is not 2xx."""
    headers = {"Content-Type": "application/json", "User-Agent": f"trainserve/{__version__}"}
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 (an http(s) URL)
            response.read()
    except urllib.error.HTTPError as exc:
        if 400 <= exc.code < 500:
            raise Refused(f"HTTP {exc.code} {exc.reason}") from None
        raise


@dataclass(frozen=True)
class Tally:
    """Deliveries (one document to one receiver): done, and not done by the controller's exit; the last failure."""

    delivered: int
    failed: int
    why: str | None = None


class Sender:
    """Posts `render(receiver, document)` to every receiver from a background thread; `send` never blocks."""

    def __init__(
        self,
        receivers: tuple[Receiver, ...],
        render: Callable[[Receiver, dict], bytes],
        post: Callable[[str, bytes, float], None] = post_json,
        attempts: int = ATTEMPTS,
        backoff_s: float = BACKOFF_S,
    ):
        self.receivers, self.render, self.post = receivers, render, post
        self.attempts, self.backoff_s = attempts, backoff_s
        self.queue: queue.Queue = queue.Queue(CAPACITY)
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.accepted, self.delivered, self.why = 0, 0, None
        self.thread = threading.Thread(target=self._run, name="rollout-notify", daemon=True)
        self.thread.start()

    def send(self, document: dict) -> None:
        for receiver in self.receivers:
            with self.lock:
                self.accepted += 1
            try:
                self.queue.put_nowait((receiver, document))
            except queue.Full:
                self._failed(receiver, f"{CAPACITY} notifications already waiting: this one dropped")

    def close(self, within_s: float = FLUSH_S) -> Tally:
        """What is queued, delivered within `within_s` at most; the rest counted as failed."""
        with contextlib.suppress(queue.Full):  # full: the thread stops at the deadline instead
            self.queue.put_nowait(None)
        self.thread.join(within_s)
        self.stopping.set()  # a retry's wait ends now; an attempt in flight ends within its timeout, uncounted
        with self.lock:
            failed = self.accepted - self.delivered
            why = self.why or (f"not delivered within {within_s:g} s of the controller's exit" if failed else None)
            return Tally(self.delivered, failed, why)

    def _run(self) -> None:
        while (item := self.queue.get()) is not None and not self.stopping.is_set():
            self._deliver(*item)

    def _deliver(self, receiver: Receiver, document: dict) -> None:
        body = self.render(receiver, document)
        for attempt in range(self.attempts):
            try:
                self.post(receiver.url, body, TIMEOUT_S)
            except Refused as exc:
                self._failed(receiver, str(exc))
                return
            except (OSError, ValueError) as exc:  # refused, timed out, DNS, a 5xx (HTTPError is an OSError)
                if attempt + 1 == self.attempts or self.stopping.wait(self.backoff_s * 2**attempt):
                    self._failed(receiver, f"{getattr(exc, 'reason', None) or exc} ({attempt + 1} attempts)")
                    return
            else:
                with self.lock:
                    self.delivered += 1
                return

    def _failed(self, receiver: Receiver, why: str) -> None:
        said = f"{receiver.url}: {why}"
        log.warning("rollout notification not delivered: %s", said)
        with self.lock:
            self.why = said
