"""What the benchmarks need to reach a local server: a free port, and an HTTP opener that ignores proxies."""

from __future__ import annotations

import socket
import urllib.request

# Loopback needs no proxy, whatever the environment says.
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
