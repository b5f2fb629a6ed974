"""What the benchmarks need around a local server: a free port, an HTTP opener that ignores proxies, a
process's CPU time (to show who was saturated), and the model they serve."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
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


def train_bench_model(root: Path, size: int = 12000, seed: int = 0) -> None:
    """The served model of the eval benchmarks: a CNN trained 1 epoch on `size` synthetic 28x28x1 images,
    published as the next version of `root/models/bench`, its held-out split under `root/data`."""
    print(f"training the benchmark model (synthetic 28x28x1, CNN, 1 epoch, seed {seed})...", flush=True)
    paths = ["--export-base", str(root / "models"), "--data-dir", str(root / "data"), "--logs-dir", str(root / "logs")]
    data = ["--data", "synthetic", "--synthetic-size", str(size), "--epochs", "1", "--seed", str(seed)]
    command = [sys.executable, "-m", "trainserve", "train", "--model-name", "bench", *data, *paths]
    subprocess.run(command, check=True, capture_output=True)


def start_serve_local(log: Path, *flags: str) -> tuple[subprocess.Popen, int, int]:
    """serve-local in a process of its own on free ports, its output in `log`: (process, gRPC port, REST port)."""
    port, rest_port = free_port(), free_port()
    command = [sys.executable, "-m", "trainserve", "serve-local", f"--port={port}", f"--rest_api_port={rest_port}"]
    with open(log, "w") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen([*command, *flags], stdout=out, stderr=subprocess.STDOUT), port, rest_port
