"""SIGTERM stops a server whose main thread is waiting, whichever thread the kernel hands the signal to."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.unit

# The signal goes to another thread, and only once the main thread is blocked waiting: the case in which a plain
# Event.wait() never returns (CPython runs the handler only when the main thread runs bytecode again).
SCRIPT = textwrap.dedent(
    """
    import signal, sys, threading
    from trainserve.signals import stopped_by_signals, wait_until_stopped

    main = threading.main_thread()

    def main_is_blocked_in_wait():
        with open(f"/proc/self/task/{main.native_id}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]  # R running, S sleeping (blocked on the lock)
        return sys._current_frames()[main.ident].f_code.co_name == "wait" and state == "S"

    def deliver_once_main_waits():
        while not main_is_blocked_in_wait():
            threading.Event().wait(0.01)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)  # to this thread, not the main one

    stop = threading.Event()
    with stopped_by_signals(stop):
        threading.Thread(target=deliver_once_main_waits, daemon=True).start()
        wait_until_stopped(stop)
    print("stopped")
    """
)


def test_a_sigterm_delivered_to_another_thread_stops_the_waiting_main_thread():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "stopped", done.stderr
