"""What the benchmarks need around a local server: a free port, an HTTP opener that ignores proxies, and a
process's CPU time (to show who was saturated)."""

from __future__ import annotations

import os
import socket
import urllib.request
from pathlib import Path

# Loopback needs no proxy, whatever the environment says.
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/PID/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
