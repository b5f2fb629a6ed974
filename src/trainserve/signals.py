"""SIGTERM and SIGINT for the long-running commands (serve-local, capture): they set a stop event, and the main
thread waits for it in short slices.

Why slices: CPython runs a Python signal handler only in the main thread, and only once that thread runs
bytecode again. A process-directed signal may be delivered to any thread (TensorFlow's and gRPC's threads are
many), and then a main thread blocked in `Event.wait()` with no timeout is never interrupted: the handler stays
pending and the server ignores SIGTERM until something else wakes it. Waking every fraction of a second bounds
that delay."""

from __future__ import annotations

import logging
import signal
import threading
from contextlib import contextmanager

log = logging.getLogger(__name__)

WAKE_SECONDS = 0.2  # how long a signal delivered to another thread may wait for its handler
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def stopped_by_signals(stop: threading.Event):
    """SIGTERM and SIGINT set `stop` while the block runs (the handlers they replace come back after it). Only the
    main thread may install handlers, so a server started from another thread (tests) is stopped through `stop`
    alone."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in STOP_SIGNALS:
            previous[signum] = signal.signal(signum, lambda num, frame: _request_stop(stop, num))
    try:
        yield stop
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def wait_until_stopped(stop: threading.Event) -> None:
    """Block until `stop` is set, waking often enough that a pending signal handler runs (module docstring)."""
    while not stop.wait(WAKE_SECONDS):
        pass


def _request_stop(stop: threading.Event, signum: int) -> None:
    log.info("received %s", signal.Signals(signum).name)
    stop.set()
