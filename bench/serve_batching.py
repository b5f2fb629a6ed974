"""Serving many small requests: serve-local with `--enable_batching` against without it.

One run, one machine, one model (the small CNN on 28x28x1 uint8 that bench/eval_throughput.py serves,
untrained: weights do not change the compute). 64 closed-loop clients each send one example per
Predict, with a different example each, for a fixed time; the configurations differ only in batching:
  off                       no --enable_batching
  on, timeout 0 / 1 / 5 ms  max_batch_size 64, num_batch_threads = CPUs (the batching guide's CPU advice)
Every server gets --grpc_max_threads=128: a request waiting for its batch holds a gRPC thread, so the
default (4 x CPUs) would cap a batch at 8. Prints examples/s, p50/p99 latency, and ratios:
examples/s against the in-process ceiling (the SavedModel's signature called directly at its best
batch size) and against batching off; latency against one in-process call at batch 64, the least a
request can wait when 64 arrive together. Target: batching on >= 5x batching off in examples/s.

    python bench/serve_batching.py [--seconds 15] [--clients 64]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import grpc  # noqa: E402
import numpy as np  # noqa: E402
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc  # noqa: E402

from trainserve.savedmodel import LoadedModel  # noqa: E402
from trainserve.tensors import to_tensor_proto  # noqa: E402

SHAPE = (28, 28, 1)


@dataclass
class Result:
    name: str
    examples_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    mean_batch: float  # rows per model run, from serve-local's batching metrics (0 when off)


def export_model(path: Path) -> None:
    """The CNN trainserve trains, exported as `trainserve train` exports it (a child process keeps
    Keras out of this one)."""
    code = (
        "import sys; from trainserve.training.model import build_model; "
        "from trainserve.training.export import export_savedmodel; "
        f"export_savedmodel(build_model('cnn', {SHAPE}, 10), sys.argv[1], {SHAPE})"
    )
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, capture_output=True)


def in_process(version_dir: Path, x: np.ndarray, clients: int) -> tuple[float, int, float]:
    """(best examples/s, its batch size, seconds per call at batch `clients`), each timed after a warm-up."""
    model = LoadedModel(version_dir)
    best = (0.0, 0)
    for batch in (32, 64, 128, 256, 512):
        model.run("serving_default", {"images": x[:batch]})
        started = time.perf_counter()
        for start in range(0, len(x), batch):
            model.run("serving_default", {"images": x[start : start + batch]})
        best = max(best, (len(x) / (time.perf_counter() - started), batch))
    started = time.perf_counter()
    for _ in range(50):
        model.run("serving_default", {"images": x[:clients]})
    per_call = (time.perf_counter() - started) / 50
    model.close()
    return best[0], best[1], per_call


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(tmp: Path, name: str, timeout_micros: int | None) -> tuple[subprocess.Popen, str, str]:
    port, rest_port = free_port(), free_port()
    (tmp / "monitoring.config").write_text("prometheus_config { enable: true }\n")
    flags = [f"--port={port}", "--model_name=bench", f"--model_base_path={tmp / 'models' / 'bench'}"]
    flags += [
        "--grpc_max_threads=128",
        f"--rest_api_port={rest_port}",
        f"--monitoring_config_file={tmp / 'monitoring.config'}",
    ]
    if timeout_micros is not None:
        params = tmp / f"{name}.config"
        params.write_text(
            f"max_batch_size {{ value: 64 }}\nbatch_timeout_micros {{ value: {timeout_micros} }}\n"
            f"num_batch_threads {{ value: {len(os.sched_getaffinity(0))} }}\nmax_enqueued_batches {{ value: 1000 }}\n"
        )
        flags += ["--enable_batching", f"--batching_parameters_file={params}"]
    log = open(tmp / f"{name}.log", "w")  # noqa: SIM115  (the child writes to it until terminated)
    server = subprocess.Popen([sys.executable, "-m", "trainserve", "serve-local", *flags], stdout=log, stderr=log)
    return server, f"127.0.0.1:{port}", f"http://127.0.0.1:{rest_port}/monitoring/prometheus/metrics"


def batch_totals(metrics_url: str) -> tuple[float, float]:
    """(rows run, model runs) so far, from the processed_batch_size histogram."""
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    text = opener.open(metrics_url, timeout=10).read().decode()
    values = {}
    for line in text.splitlines():
        for suffix in ("_sum", "_count"):
            if line.startswith(f":tensorflow:serving:batching_session:processed_batch_size{suffix}"):
                values[suffix] = float(line.rsplit(" ", 1)[1])
    return values.get("_sum", 0.0), values.get("_count", 0.0)


def request(image: np.ndarray) -> predict_pb2.PredictRequest:
    message = predict_pb2.PredictRequest()
    message.model_spec.name = "bench"
    to_tensor_proto(image[np.newaxis], into=message.inputs["images"])
    return message


def wait_ready(stub, message, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            stub.Predict(message, timeout=5)
            return
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def closed_loop(stub, requests: list, seconds: float) -> tuple[int, list[float], int]:
    """Each client sends its next request when its answer arrives (callbacks: no thread per client)."""
    latencies: list[float] = []
    errors = [0]
    lock, done = threading.Lock(), threading.Event()
    end = time.perf_counter() + seconds
    outstanding = [len(requests)]

    def send(message):
        started = time.perf_counter()
        stub.Predict.future(message, timeout=30).add_done_callback(lambda f: finished(f, message, started))

    def finished(future, message, started):
        now = time.perf_counter()
        with lock:
            if future.exception() is None:
                latencies.append(now - started)
            else:
                errors[0] += 1
            if now >= end:
                outstanding[0] -= 1
                if not outstanding[0]:
                    done.set()
                return
        send(message)

    for message in requests:
        send(message)
    done.wait(seconds + 60)
    return len(latencies), latencies, errors[0]


def measure(tmp: Path, name: str, timeout_micros: int | None, x: np.ndarray, args) -> Result:
    server, target, metrics_url = start_server(tmp, name.replace(" ", "_").replace(",", ""), timeout_micros)
    try:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(target))
        requests = [request(x[i]) for i in range(args.clients)]
        wait_ready(stub, requests[0])
        closed_loop(stub, requests, 2)  # warm-up: connections, server threads, TF's first runs
        rows_before, runs_before = batch_totals(metrics_url)
        started = time.perf_counter()
        count, latencies, errors = closed_loop(stub, requests, args.seconds)
        elapsed = time.perf_counter() - started
        rows, runs = batch_totals(metrics_url)
    finally:
        server.terminate()
        server.wait(timeout=60)
    ms = np.array(latencies) * 1000
    mean_batch = (rows - rows_before) / (runs - runs_before) if runs > runs_before else 0.0
    p50, p99 = float(np.percentile(ms, 50)), float(np.percentile(ms, 99))
    return Result(name, count / elapsed, p50, p99, errors, mean_batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15, help="measured time per configuration")
    parser.add_argument("--clients", type=int, default=64, help="concurrent closed-loop clients")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        print("exporting the benchmark model (CNN, 28x28x1)...", flush=True)
        export_model(tmp / "models" / "bench" / "1")
        x = np.random.default_rng(1).integers(0, 256, (8192, *SHAPE), dtype=np.uint8)
        ceiling, best_batch, call_s = in_process(tmp / "models" / "bench" / "1", x, args.clients)
        configs = [("batching off", None), ("on, timeout 0", 0), ("on, timeout 1 ms", 1000), ("on, timeout 5 ms", 5000)]
        results = []
        for name, timeout_micros in configs:
            print(f"measuring {name} ({args.seconds:g} s)...", flush=True)
            results.append(measure(tmp, name, timeout_micros, x, args))
        report(results, ceiling, best_batch, call_s, args)


def report(results: list[Result], ceiling: float, best_batch: int, call_s: float, args) -> None:
    off = results[0].examples_per_s
    call_ms = call_s * 1000
    print(f"\n{args.clients} closed-loop clients, 1 example per request, {os.cpu_count()} CPUs, loopback")
    print(f"in-process ceiling: {ceiling:.0f} ex/s at batch {best_batch}; one call at batch {args.clients}: "
          f"{call_ms:.2f} ms")  # fmt: skip
    print(
        f"{'':18}{'ex/s':>8}{'/ceiling':>10}{'/off':>7}{'p50 ms':>9}{'p99 ms':>9}{'p50/call':>10}{'p99/call':>10}"
        f"{'batch':>7}"
    )
    for r in results:
        print(
            f"{r.name:18}{r.examples_per_s:8.0f}{r.examples_per_s / ceiling:10.3f}{r.examples_per_s / off:7.1f}"
            f"{r.p50_ms:9.2f}{r.p99_ms:9.2f}{r.p50_ms / call_ms:10.1f}{r.p99_ms / call_ms:10.1f}"
            f"{r.mean_batch:7.1f}" + (f"  ({r.errors} errors)" if r.errors else "")
        )
    best = max(results[1:], key=lambda r: r.examples_per_s)
    print(f"best batching on vs off: {best.examples_per_s / off:.1f}x ({best.name}; target >= 5x)")


if __name__ == "__main__":
    main()
