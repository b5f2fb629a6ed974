"""The train -> serve loop in wall-clock seconds, each step as a ratio to a bare `import tensorflow`.

Every step is a fresh process, as a user runs it, alternated with the bare import so both see the same
machine; the median of `--repeats` runs of each is printed:

  import      python -c "import tensorflow"                          (the floor every step pays)
  train       trainserve train --epochs 1 on the bundled digits, to a published version
  serve-local trainserve serve-local on that version, from start to the version AVAILABLE over REST

Targets (issue 21): train <= 1.8 x, serve-local <= 1.3 x the bare import. Never part of the test run.

    python bench/loop.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from loopback import DIRECT, free_port

ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
TRAINSERVE = [sys.executable, "-m", "trainserve"]
TARGETS = {"train": 1.8, "serve-local": 1.3}


def timed(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, env=ENV, check=True, capture_output=True)
    return time.perf_counter() - started


def bare_import() -> float:
    return timed([sys.executable, "-c", "import tensorflow"])


def train(root: Path) -> float:
    return timed(
        [
            *TRAINSERVE,
            "train",
            "--epochs",
            "1",
            "--export-base",
            str(root / "models"),
            "--logs-dir",
            str(root / "logs"),
            "--data-dir",
            str(root / "data"),
            "--keep",
            "1",
        ]
    )


def available(rest: str) -> bool:
    try:
        with DIRECT.open(f"{rest}/v1/models/digits", timeout=1) as response:
            states = [v["state"] for v in json.loads(response.read())["model_version_status"]]
    except OSError:
        return False
    return "AVAILABLE" in states


def serve_local(root: Path) -> float:
    """Start to AVAILABLE; the server is then stopped (SIGTERM) outside the timing."""
    grpc_port, rest_port = free_port(), free_port()
    started = time.perf_counter()
    server = subprocess.Popen(
        [
            *TRAINSERVE,
            "serve-local",
            f"--port={grpc_port}",
            f"--rest_api_port={rest_port}",
            "--model_name=digits",
            f"--model_base_path={root / 'models' / 'digits'}",
        ],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while not available(f"http://127.0.0.1:{rest_port}"):
            if server.poll() is not None:
                raise SystemExit(f"serve-local exited with {server.returncode} before the model was AVAILABLE")
            time.sleep(0.05)
        return time.perf_counter() - started
    finally:
        server.terminate()
        server.wait(timeout=60)


def median_alternated(steps: dict[str, Callable[[], float]], repeats: int) -> dict[str, float]:
    runs: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            runs[name].append(step())
    return {name: statistics.median(times) for name, times in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="alternated runs of each step (median printed)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        steps = {"import": bare_import, "train": lambda: train(root), "serve-local": lambda: serve_local(root)}
        medians = median_alternated(steps, args.repeats)
    floor = medians["import"]
    print(f"median of {args.repeats} alternated runs, {os.cpu_count()} CPUs")
    print(f"  {'bare import tensorflow':34s} {floor:6.1f} s   1.00 x")
    for name, label in (("train", "train --epochs 1 to published"), ("serve-local", "serve-local start to AVAILABLE")):
        ratio = medians[name] / floor
        verdict = "met" if ratio <= TARGETS[name] else "NOT met"
        print(f"  {label:34s} {medians[name]:6.1f} s {ratio:6.2f} x  (target <= {TARGETS[name]} x: {verdict})")


if __name__ == "__main__":
    main()
