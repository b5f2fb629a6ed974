"""What `trainserve proxy` costs: throughput and p50/p99 latency through the proxy against direct, in one run.

One published model (the small CNN on 28x28x1 uint8 of bench/eval_throughput.py) on serve-local, and
`trainserve proxy` in front of it in a process of its own, writing every Predict call (sampling rate 1: the
most it can cost). `trainserve load` measures each path in its own process, as users run it: batch 256 in a
closed loop (4 in flight: throughput), and batch 1 in an open loop at a moderate rate (Poisson arrivals, latency
from the scheduled send time: what capture adds to a request). Direct and proxy alternate, and which goes first,
so that both see the same machine; the first pair warms everything up and is dropped; figures are medians.
Targets (issue 38): proxy >= 0.8 x direct examples/s at batch 256; p99 added <= 2 ms at batch 1.

    python bench/capture_cost.py [--pairs 3] [--rate 100] [--window-s 2]
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
import urllib.request
from pathlib import Path

from loopback import free_port, start_serve_local, train_bench_model

from trainserve.tfrecord import iter_records


def start_proxy(tmp: Path, upstream: str) -> tuple[subprocess.Popen, str]:
    """`trainserve proxy` in its own process in front of `upstream`, every Predict written under tmp/captures."""
    port = free_port()
    command = [sys.executable, "-m", "trainserve", "proxy", "--upstream", upstream, "--port", str(port)]
    command += ["--filename-prefix", str(tmp / "captures" / "bench"), "--sampling-rate", "1"]
    with open(tmp / "capture.log", "w") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT), f"127.0.0.1:{port}"


def wait_ready(rest: str) -> None:
    """serve-local opens its ports once the model is AVAILABLE."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{rest}/v1/models/bench", timeout=5) as answer:
                if b"AVAILABLE" in answer.read():
                    return
        except OSError:
            time.sleep(0.2)
    raise SystemExit("serve-local did not serve the benchmark model within 300 s")


def load_point(target: str, report: Path, window_s: float, batch: int, *mode: str) -> dict:
    """One `trainserve load` point (synthetic inputs) in its own process: its report's point."""
    command = [sys.executable, "-m", "trainserve", "load", "--server", target, "--model", "bench"]
    command += ["--batch-sizes", str(batch), "--window-s", str(window_s), "--report", str(report), *mode]
    command += ["--mark-origin=false"]  # load's calls are recorded like any client's: capture's whole cost
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"trainserve load against {target} failed ({proc.returncode}):\n{proc.stderr}")
    (point,) = json.loads(report.read_text())["points"]
    return point


def measure(targets: dict[str, str], tmp: Path, args) -> dict[str, dict[str, list[dict]]]:
    """Both scenarios on both paths, alternated, after one warm-up pair (dropped)."""
    scenarios = {"batch 256": (256, "--concurrency", "4"), "batch 1": (1, "--rate", str(args.rate))}
    seen: dict[str, dict[str, list[dict]]] = {s: {name: [] for name in targets} for s in scenarios}
    for pair in range(args.pairs + 1):
        for name in list(targets) if pair % 2 == 0 else list(reversed(targets)):
            for scenario, (batch, *mode) in scenarios.items():
                point = load_point(targets[name], tmp / "load.json", args.window_s, batch, *mode)
                if pair:
                    seen[scenario][name].append(point)
    return seen


def median(points: list[dict], key: str, sub: str | None = None) -> float:
    return statistics.median(p[key][sub] if sub else p[key] for p in points)


def report(seen: dict, captured: int, args) -> None:
    cores = len(os.sched_getaffinity(0))
    print(f"\nsmall CNN, 28x28x1 uint8, {cores} CPUs, loopback; capture writes every Predict ({captured} records)")
    for scenario, paths in seen.items():
        for name, points in paths.items():
            print(
                f"  {scenario:<9} {name:<7} {median(points, 'examples_per_s'):9.0f} ex/s  "
                f"p50 {median(points, 'latency_ms', 'p50'):7.2f} ms  p99 {median(points, 'latency_ms', 'p99'):7.2f} ms"
            )
    b256, b1 = seen["batch 256"], seen["batch 1"]
    ratio = median(b256["proxy"], "examples_per_s") / median(b256["direct"], "examples_per_s")
    added = median(b1["proxy"], "latency_ms", "p99") - median(b1["direct"], "latency_ms", "p99")
    print(f"  batch 256, 4 in flight: proxy / direct = {ratio:.2f} (target >= 0.8)")
    print(f"  batch 1 at {args.rate:g} req/s: p99 added {added:+.2f} ms (target <= 2 ms)")
    print(f"  (medians of {args.pairs} alternated pairs after a warm-up pair)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3, help="direct/proxy pairs measured (after one warm-up)")
    parser.add_argument("--rate", type=float, default=100, help="batch-1 requests/s (open loop): a moderate load")
    parser.add_argument("--window-s", type=float, default=2.0, help="load's measurement window")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        train_bench_model(tmp)
        server, port, rest_port = start_serve_local(
            tmp / "serve.log", "--model_name=bench", f"--model_base_path={tmp / 'models' / 'bench'}"
        )
        proxy = None
        try:
            wait_ready(f"http://127.0.0.1:{rest_port}")
            proxy, proxy_target = start_proxy(tmp, f"127.0.0.1:{port}")
            seen = measure({"direct": f"127.0.0.1:{port}", "proxy": proxy_target}, tmp, args)
        finally:
            for process in (proxy, server):
                if process is not None:
                    process.terminate()
                    process.wait(timeout=120)
        captured = 0
        for path in (tmp / "captures").glob("*.tfrecord"):
            with open(path, "rb") as stream:
                captured += sum(1 for _ in iter_records(stream))
        report(seen, captured, args)


if __name__ == "__main__":
    main()
