"""Evaluation throughput: `trainserve eval` against the in-process ceiling and the usual clients.

One run, one machine, one published model (a small CNN on 28x28x1 uint8, as docs/serving-on-cpus.md measured),
serve-local on loopback. Prints examples/s and ratios:
  (a) in-process ceiling: the SavedModel's signature called directly, best over batch sizes and 1, 2 and 4
      threads calling at once (bench/ceiling.py): a server runs requests concurrently, so a one-thread
      figure is no ceiling (issue 24 saw (b) beat it 1.23 x)
  (b) `trainserve eval` at default settings (batch 256, 4 in flight), in its own process as users run it
  (c) one example per request, sequential, as TF Serving's mnist_client.py does
  (d) REST JSON `:predict` at batch 256, sequential
  (e) `trainserve load`'s closed loop at concurrency 1 against a plain timed loop of the same requests
Targets: (b) >= 0.9 x (a) (the client no longer competes with TensorFlow for the cores), (b) >= 40 x (c),
(e) within 10 % of the plain loop (load mode's windows and threads add no overhead of their own).
Then the client's footprint (issue 14): start to first request, process launch to the first Predict (target
<= 1 s), and the peak RSS of 1,000,000 synthetic examples through `trainserve eval` (target <= 150 MB), beside
what importing tensorflow_serving.apis alone costs (what the client did before trainserve.protos).

    python bench/eval_throughput.py [--examples 10000] [--memory-examples 1000000]
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
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import grpc  # noqa: E402
import numpy as np  # noqa: E402
from loopback import start_serve_local, train_bench_model  # noqa: E402

from trainserve.protos import predict_pb2, prediction_service_pb2_grpc  # noqa: E402
from trainserve.sources.synthetic import SyntheticSpec, synthetic_examples  # noqa: E402
from trainserve.tensors import to_tensor_proto  # noqa: E402

SPEC = SyntheticSpec((28, 28, 1), 10)


def one_per_request(target: str, x: np.ndarray) -> float:
    """(c): mnist_client.py's loop: one image per Predict, one at a time."""
    stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(target))
    started = time.perf_counter()
    for image in x:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "bench"
        to_tensor_proto(image[np.newaxis], into=request.inputs["images"])
        stub.Predict(request, timeout=10)
    return len(x) / (time.perf_counter() - started)


def plain_loop_rps(stub, request: predict_pb2.PredictRequest, seconds: float) -> float:
    """The independent measurement of load mode: one Predict at a time in a plain timed loop (requests/s)."""
    stub.Predict(request, timeout=10)
    n, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        stub.Predict(request, timeout=10)
        n += 1
    return n / (time.perf_counter() - started)


def load_vs_plain(target: str, x: np.ndarray, batch: int, repeats: int) -> tuple[list[float], list[float]]:
    """(e): `trainserve load`'s closed loop at concurrency 1 against the plain loop, alternated `repeats` times
    so that drift on a shared machine hits both alike: (load-mode requests/s, plain requests/s), pair by pair."""
    from trainserve.evaluation.load.config import LoadConfig
    from trainserve.evaluation.load.sweep import run_sweep

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "bench"
    to_tensor_proto(x[:batch], into=request.inputs["images"])
    stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(target))
    config = LoadConfig(server=target, model="bench", batch_sizes=(batch,), concurrency=(1,), window_s=1.5)
    loaded, plain = [], []
    for _ in range(repeats):
        plain.append(plain_loop_rps(stub, request, 3 * config.window_s))
        loaded.append(run_sweep(config).report["points"][0]["throughput_rps"])
    return loaded, plain


def spread(values: list[float]) -> float:
    """Half the range over the median, in percent: how much one measurement moves between repeats here."""
    return 50 * (max(values) - min(values)) / statistics.median(values)


def rest_json(rest: str, x: np.ndarray, batch: int = 256) -> float:
    """(d): REST `instances` JSON at the eval client's batch size, one request at a time."""
    started = time.perf_counter()
    for start in range(0, len(x), batch):
        body = json.dumps({"instances": x[start : start + batch].tolist()}).encode()
        with urllib.request.urlopen(urllib.request.Request(f"{rest}/v1/models/bench:predict", body), timeout=30) as r:
            json.loads(r.read())
    return len(x) / (time.perf_counter() - started)


# `trainserve eval` with a hook that prints when the first Predict goes out (wall clock, seconds), and the CPU
# seconds of this client and of the server (pid in SERVER_PID) over one window, the first Predict's start to the
# last one's answer, measured by the same clock: CPU seconds per second of that window cannot exceed the cores.
TIMED_EVAL = """
import os, sys, time
from trainserve.client import connection as client
predict = client.ServingClient.predict
CLOCK = os.sysconf("SC_CLK_TCK")
def server_cpu_s():
    fields = open(f"/proc/{os.environ['SERVER_PID']}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK
def timed_predict(self, *args, **kwargs):
    if not getattr(timed_predict, "first", None):
        timed_predict.first = (time.perf_counter(), time.process_time(), server_cpu_s())
        print(f"first-request {time.time()}", file=sys.stderr, flush=True)
    answer = predict(self, *args, **kwargs)
    timed_predict.last = (time.perf_counter(), time.process_time(), server_cpu_s())
    return answer
client.ServingClient.predict = timed_predict
from trainserve.cli import main
code = main(sys.argv[1:])
(wall, cpu, server), (wall0, cpu0, server0) = timed_predict.last, timed_predict.first
print(f"window-s {wall - wall0}", file=sys.stderr)
print(f"cpu-s {cpu - cpu0}", file=sys.stderr)
print(f"server-cpu-s {server - server0}", file=sys.stderr)
# VmHWM: this process's own peak RSS (ru_maxrss survives exec: it can report the parent's, here TensorFlow's).
peak = next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(f"peak-rss-kb {peak}", file=sys.stderr)
sys.exit(code)
"""


@dataclass
class EvalRun:
    """One `trainserve eval` process as the bench saw it."""

    report: dict
    start_s: float  # launch to its first Predict
    peak_rss_mb: float
    client_cores: float  # its CPU seconds per second, first Predict to last answer
    server_cores: float  # the server's CPU seconds per second over the same window


def timed_eval(server: str, server_pid: int, report: Path, *args: str) -> EvalRun:
    """One `trainserve eval` process, with its CPU use and the server's beside its figures."""
    launched = time.time()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            TIMED_EVAL,
            "eval",
            "--server",
            server,
            "--model",
            "bench",
            "--report",
            str(report),
            "--wait",
            "120",
            *args,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SERVER_PID": str(server_pid)},
    )
    stderr = proc.stderr.read()
    if proc.wait() != 0:
        raise SystemExit(f"trainserve eval failed ({proc.returncode}):\n{stderr}")
    keys = ("first-request ", "peak-rss-kb ", "cpu-s ", "server-cpu-s ", "window-s ")
    said = dict(line.split(" ", 1) for line in stderr.splitlines() if line.startswith(keys))
    client, server = cores_used(float(said["cpu-s"]), float(said["server-cpu-s"]), float(said["window-s"]))
    return EvalRun(
        json.loads(report.read_text()),
        float(said["first-request"]) - launched,
        int(said["peak-rss-kb"]) / 1024,
        client,
        server,
    )


def cores_used(client_s: float, server_s: float, window_s: float) -> tuple[float, float]:
    """CPU seconds per second of one window for the client and the server. Both ran on this machine's cores, so
    neither, nor both together, can exceed them beyond the clock's resolution: a figure that does fails the bench
    (it would mean the windows differ, which is what printed 2.61 + 1.71 of 2 cores before)."""
    cores = len(os.sched_getaffinity(0))
    slack = 2 * 2 / os.sysconf("SC_CLK_TCK") / window_s  # two clock ticks at each end of the window
    client, server = client_s / window_s, server_s / window_s
    if min(client, server) < 0 or client + server > cores * (1 + 0.02) + slack:
        raise SystemExit(
            f"impossible CPU accounting: client {client:.2f} + server {server:.2f} cores over a {window_s:.2f} s "
            f"window on {cores} cores: expected at most {cores}"
        )
    return client, server


def tensorflow_serving_import() -> tuple[float, float]:
    """What the client paid before trainserve.protos: seconds and peak RSS (MB) of importing the real protos."""
    code = (
        "import resource, time; t = time.perf_counter(); import tensorflow_serving.apis.prediction_service_pb2; "
        "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    return float(out[-2]), float(out[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=20000, help="held-out examples for (a), (b), (d)")
    parser.add_argument("--single", type=int, default=1000, help="examples sent one per request for (c)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of (b); the median is reported")
    parser.add_argument("--memory-examples", type=int, default=1_000_000, help="0 skips the memory run")
    args = parser.parse_args()
    from ceiling import in_process_ceiling

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        train_bench_model(tmp)
        version_dir = tmp / "models" / "bench" / "1"
        x = synthetic_examples(SPEC, args.examples, seed=1)[0]
        ceiling = in_process_ceiling(version_dir, x, (64, 128, 256, 512, 1024))

        model_flags = ("--model_name=bench", f"--model_base_path={tmp / 'models' / 'bench'}")
        server, port, rest_port = start_serve_local(tmp / "server.log", *model_flags)
        try:
            # (b) reads its data from a file, as a user's run does: an uncompressed npz, streamed.
            target = f"127.0.0.1:{port}"
            y = synthetic_examples(SPEC, args.examples, seed=1)[1]
            np.savez(tmp / "heldout.npz", x_test=x, y_test=y)
            runs = [
                timed_eval(target, server.pid, tmp / "b.json", "--data", str(tmp / "heldout.npz"))
                for _ in range(args.repeats + 1)
            ]
            runs = runs[1:]  # the first warms the connection path and the server's threads
            ours = statistics.median(r.report["performance"]["examples_per_s"] for r in runs)
            start_s = statistics.median(r.start_s for r in runs)
            client_cores = statistics.median(r.client_cores for r in runs)
            server_cores = statistics.median(r.server_cores for r in runs)
            cores = len(os.sched_getaffinity(0))
            single = one_per_request(target, x[: args.single])
            rest = rest_json(f"http://127.0.0.1:{rest_port}", x)

            print(f"\n{args.examples} examples, 28x28x1 uint8, small CNN, {cores} CPUs, loopback")
            print(f"  (a) in-process ceiling                        {ceiling.describe()}")
            print(f"  (b) trainserve eval (batch 256, 4 in flight)   {ours:10.0f} ex/s")
            print(f"  (c) one example per request (mnist_client)     {single:10.0f} ex/s")
            print(f"  (d) REST JSON :predict, batch 256              {rest:10.0f} ex/s")
            print(
                f"  (b)/(a) = {ours / ceiling.examples_per_s:.2f}  (target >= 0.9); during (b) the client used "
                f"{client_cores:.2f} and the server {server_cores:.2f} of {cores} cores: on cores shared with its "
                f"client a server cannot pass (cores - client) / cores = {(cores - client_cores) / cores:.2f} x (a)"
            )
            print(f"  (b)/(c) = {ours / single:.1f}  (target >= 40)")
            print(f"  (b)/(d) = {ours / rest:.1f}")
            for batch in (1, 32):
                loaded, plain = load_vs_plain(target, x, batch, max(args.repeats, 5))
                ratio = statistics.median(a / b for a, b in zip(loaded, plain, strict=True))
                print(
                    f"  (e) trainserve load, concurrency 1, batch {batch:<3} {statistics.median(loaded):8.0f} req/s; "
                    f"plain timed loop {statistics.median(plain):.0f} req/s: {100 * (ratio - 1):+.1f} %, median of "
                    f"{len(plain)} alternated pairs (target within 10 %; the plain loop alone moves "
                    f"+-{spread(plain):.0f} % between its repeats here)"
                )
            print(f"client start to first request: {start_s:.2f} s, median of {args.repeats} (target <= 1 s)")

            if args.memory_examples:
                run = timed_eval(
                    target,
                    server.pid,
                    tmp / "memory.json",
                    "--data",
                    "synthetic",
                    "--synthetic-size",
                    str(args.memory_examples),
                )
                rss = run.report["performance"]["client_rss_mb"]
                print(
                    f"memory: {args.memory_examples:,} examples, client peak RSS {run.peak_rss_mb:.0f} MB "
                    f"(report: {rss['start']:.0f} MB at start, {rss['peak']:.0f} MB peak; target <= 150 MB)"
                )
            seconds, megabytes = tensorflow_serving_import()
            print(
                f"before (for comparison): importing tensorflow_serving.apis alone {seconds:.1f} s, {megabytes:.0f} MB"
            )
        finally:
            server.terminate()
            server.wait(timeout=60)


if __name__ == "__main__":
    main()
