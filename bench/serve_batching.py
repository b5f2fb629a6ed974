"""Serving many small requests: serve-local with `--enable_batching` against without it.

One run, one machine, one model (the small CNN on 28x28x1 uint8 that bench/eval_throughput.py serves,
untrained: weights do not change the compute). 64 closed-loop clients each send one example per
Predict, a different example each, for a fixed time; the configurations differ only in batching:
  off                       no --enable_batching
  on, timeout 0 / 1 / 5 ms  max_batch_size 64, num_batch_threads = CPUs (the batching guide's CPU advice)
  on, timeout 0, 1 thread   the same with one batch thread: a batch grows while that one runs
The clients run in their own process(es), on one asyncio loop each, sending pre-serialized requests, so
that the load generator costs little and is measured: its CPU use (and the server's) is printed beside
the figures, as a share of one core, so a reader can tell who was saturated.

The same clients also drive a gRPC floor: a grpc.aio server process whose Predict returns fixed bytes at
once (no model, no decoding, no batching). No serve-local configuration can answer one-example requests
faster than grpcio answers empty calls on the same cores, so it bounds every row below it.

Prints examples/s, p50/p99 latency, and ratios: examples/s against the in-process ceiling (the
SavedModel's signature called directly, best over batch sizes and 1/2/4 threads: bench/ceiling.py),
against batching off, and against the gRPC floor. Targets (issue 24): best batching on >= 5x off and
>= 0.25x the ceiling, its p99 no worse than off's; off no slower than 1,195 ex/s (serve-local before
grpc.aio, same settings).

    python bench/serve_batching.py [--seconds 15] [--clients 64] [--client-processes 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import grpc  # noqa: E402
import numpy as np  # noqa: E402
from loopback import DIRECT, free_port, process_cpu_s  # noqa: E402

from trainserve.protos import predict_pb2  # noqa: E402
from trainserve.tensors import to_tensor_proto  # noqa: E402

SHAPE = (28, 28, 1)
PREDICT = "/tensorflow.serving.PredictionService/Predict"
BEFORE_OFF = 1195  # ex/s, batching off, issue 24's measurement of the threaded front end
WARMUP_S = 3.0
# (name, batch_timeout_micros or None for batching off, num_batch_threads or 0 for one per CPU)
CONFIGS = [
    ("batching off", None, 0),
    ("on, timeout 0", 0, 0),
    ("on, 0, 1 thread", 0, 1),
    ("on, timeout 1 ms", 1000, 0),
    ("on, timeout 5 ms", 5000, 0),
]


@dataclass
class Result:
    name: str
    examples_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    mean_batch: float  # rows per model run, from serve-local's batching metrics (0 when off)
    client_cpu: float  # CPU seconds per wall second of the client process(es): 1.0 = one core busy
    server_cpu: float


def export_model(path: Path) -> None:
    """The CNN trainserve trains, exported as `trainserve train` exports it (a child process keeps
    Keras out of this one)."""
    code = (
        "import sys; from trainserve.task import Task; from trainserve.training.export import export_savedmodel; "
        "from trainserve.training.model import build_network; from trainserve.training.model_fn import DataSpec, "
        f"InputSpec; spec = DataSpec((InputSpec('images', {SHAPE}, 'uint8'),), Task('classification', classes=10)); "
        "export_savedmodel(build_network('cnn', spec), sys.argv[1], spec.inputs, spec.task)"
    )
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, capture_output=True)


def examples(count: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (count, *SHAPE), dtype=np.uint8)


# --- the load generator (its own process) --------------------------------------------------------------


def serialized_requests(count: int, seed: int) -> list[bytes]:
    """One-example PredictRequests, serialized once: the clients send bytes and read bytes."""
    out = []
    for image in examples(count, seed):
        message = predict_pb2.PredictRequest()
        message.model_spec.name = "bench"
        to_tensor_proto(image[np.newaxis], into=message.inputs["images"])
        out.append(message.SerializeToString())
    return out


async def drive(target: str, clients: int, seed: int, start_at: float, end_at: float) -> dict:
    """Closed-loop clients from now until `end_at`; counts answers and latencies of calls that ended
    between `start_at` and `end_at` (wall clock), and this process's CPU time over that window."""
    payloads = serialized_requests(clients, seed)
    async with grpc.aio.insecure_channel(target) as channel:
        predict = channel.unary_unary(PREDICT)  # no (de)serializers: bytes both ways
        latencies: list[float] = []
        errors = [0]

        async def client(payload: bytes) -> None:
            while time.time() < end_at:
                started = time.perf_counter()
                try:
                    await predict(payload, timeout=30)
                except grpc.aio.AioRpcError:
                    errors[0] += 1
                    continue
                if start_at <= time.time() <= end_at:
                    latencies.append(time.perf_counter() - started)

        async def cpu_at(moment: float) -> float:
            await asyncio.sleep(max(0.0, moment - time.time()))
            return time.process_time()

        runs = asyncio.gather(*(client(p) for p in payloads))
        cpu = await asyncio.gather(cpu_at(start_at), cpu_at(end_at))
        await runs
    return {"latencies": latencies, "errors": errors[0], "cpu_s": cpu[1] - cpu[0]}


def drive_main(args) -> None:
    result = asyncio.run(drive(args.drive, args.clients, args.seed, args.start_at, args.end_at))
    print(json.dumps(result))


# --- the gRPC floor (its own process) ------------------------------------------------------------------


def fixed_answer() -> bytes:
    """What serve-local answers one example with (the CNN's outputs for one row), serialized once."""
    from trainserve.serving.grpc_api import predict_response

    outputs = {"probabilities": np.full((1, 10), 0.1, np.float32), "classes": np.zeros(1, np.int64)}
    return predict_response("bench", 1, "serving_default", outputs).SerializeToString()


async def serve_fixed_answer(port: int) -> None:
    """Answer every Predict with fixed bytes, at once: grpcio's own cost per call, and nothing else."""
    answer = fixed_answer()

    async def predict(request: bytes, context) -> bytes:
        return answer

    handler = grpc.unary_unary_rpc_method_handler(predict)  # no (de)serializers: bytes both ways
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("tensorflow.serving.PredictionService", {"Predict": handler}),)
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def start_floor() -> tuple[subprocess.Popen, str, None]:
    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve-fixed-answer", str(port)])
    return server, f"127.0.0.1:{port}", None


# --- the server side -------------------------------------------------------------------------------------


def start_server(
    tmp: Path, name: str, timeout_micros: int | None, threads: int = 0
) -> tuple[subprocess.Popen, str, str]:
    port, rest_port = free_port(), free_port()
    (tmp / "monitoring.config").write_text("prometheus_config { enable: true }\n")
    flags = [f"--port={port}", "--model_name=bench", f"--model_base_path={tmp / 'models' / 'bench'}"]
    flags += [
        "--grpc_max_threads=128",  # as before grpc.aio, so that "off" is measured at the same settings
        f"--rest_api_port={rest_port}",
        f"--monitoring_config_file={tmp / 'monitoring.config'}",
    ]
    if timeout_micros is not None:
        params = tmp / f"{name}.config"
        params.write_text(
            f"max_batch_size {{ value: 64 }}\nbatch_timeout_micros {{ value: {timeout_micros} }}\n"
            f"num_batch_threads {{ value: {threads or len(os.sched_getaffinity(0))} }}\n"
            "max_enqueued_batches { value: 1000 }\n"
        )
        flags += ["--enable_batching", f"--batching_parameters_file={params}"]
    log = open(tmp / f"{name}.log", "w")  # noqa: SIM115  (the child writes to it until terminated)
    server = subprocess.Popen([sys.executable, "-m", "trainserve", "serve-local", *flags], stdout=log, stderr=log)
    return server, f"127.0.0.1:{port}", f"http://127.0.0.1:{rest_port}/monitoring/prometheus/metrics"


def batch_totals(metrics_url: str) -> tuple[float, float]:
    """(rows run, model runs) so far, from the processed_batch_size histogram."""
    text = DIRECT.open(metrics_url, timeout=10).read().decode()
    values = {}
    for line in text.splitlines():
        for suffix in ("_sum", "_count"):
            if line.startswith(f":tensorflow:serving:batching_session:processed_batch_size{suffix}"):
                values[suffix] = float(line.rsplit(" ", 1)[1])
    return values.get("_sum", 0.0), values.get("_count", 0.0)


def wait_ready(target: str, timeout: float = 120) -> None:
    payload = serialized_requests(1, 0)[0]
    predict = grpc.insecure_channel(target).unary_unary(PREDICT)
    deadline = time.monotonic() + timeout
    while True:
        try:
            predict(payload, timeout=5)
            return
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def run_clients(target: str, server_pid: int, args) -> tuple[list[float], int, float, float]:
    """The client processes over one window: (latencies, errors, client CPU share, server CPU share)."""
    start_at = time.time() + WARMUP_S + 1  # the clients' warm-up: connections, server threads, TF's first runs
    end_at = start_at + args.seconds
    per_process = [
        args.clients // args.client_processes + (i < args.clients % args.client_processes)
        for i in range(args.client_processes)
    ]
    drivers = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--drive",
                target,
                "--clients",
                str(n),
                "--seed",
                str(i),
                "--start-at",
                repr(start_at),
                "--end-at",
                repr(end_at),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i, n in enumerate(per_process)
    ]
    time.sleep(max(0.0, start_at - time.time()))
    server_before = process_cpu_s(server_pid)
    time.sleep(max(0.0, end_at - time.time()))
    server_cpu = process_cpu_s(server_pid) - server_before
    results = [json.loads(d.communicate(timeout=120)[0]) for d in drivers]
    latencies = [v for r in results for v in r["latencies"]]
    client_cpu = sum(r["cpu_s"] for r in results)
    return latencies, sum(r["errors"] for r in results), client_cpu / args.seconds, server_cpu / args.seconds


def measure(name: str, started: tuple[subprocess.Popen, str, str | None], args) -> Result:
    """The clients against a started server (process, target, metrics URL or None), which this ends."""
    server, target, metrics_url = started
    try:
        wait_ready(target)
        rows_before, runs_before = batch_totals(metrics_url) if metrics_url else (0.0, 0.0)
        latencies, errors, client_cpu, server_cpu = run_clients(target, server.pid, args)
        rows, runs = batch_totals(metrics_url) if metrics_url else (0.0, 0.0)
    finally:
        server.terminate()
        server.wait(timeout=60)
    ms = np.array(latencies) * 1000
    mean_batch = (rows - rows_before) / (runs - runs_before) if runs > runs_before else 0.0
    p50, p99 = float(np.percentile(ms, 50)), float(np.percentile(ms, 99))
    return Result(name, len(latencies) / args.seconds, p50, p99, errors, mean_batch, client_cpu, server_cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15, help="measured time per configuration")
    parser.add_argument("--clients", type=int, default=64, help="concurrent closed-loop clients")
    parser.add_argument("--client-processes", type=int, default=1, help="processes the clients are spread over")
    parser.add_argument("--drive", metavar="TARGET", help=argparse.SUPPRESS)  # a client process
    parser.add_argument("--serve-fixed-answer", type=int, metavar="PORT", help=argparse.SUPPRESS)  # the floor
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--end-at", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drive:
        return drive_main(args)
    if args.serve_fixed_answer:
        return asyncio.run(serve_fixed_answer(args.serve_fixed_answer))
    from ceiling import in_process_ceiling

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        print("exporting the benchmark model (CNN, 28x28x1)...", flush=True)
        export_model(tmp / "models" / "bench" / "1")
        ceiling = in_process_ceiling(tmp / "models" / "bench" / "1", examples(8192), (32, 64, 128, 256, 512))
        print(f"measuring the gRPC floor ({args.seconds:g} s)...", flush=True)
        floor = measure("gRPC floor", start_floor(), args)
        results = []
        for name, timeout_micros, threads in CONFIGS:
            print(f"measuring {name} ({args.seconds:g} s)...", flush=True)
            label = name.replace(" ", "_").replace(",", "")
            results.append(measure(name, start_server(tmp, label, timeout_micros, threads), args))
        report(floor, results, ceiling, args)


def report(floor: Result, results: list[Result], ceiling, args) -> None:
    off = results[0]
    print(
        f"\n{args.clients} closed-loop clients in {args.client_processes} process(es), 1 example per request, "
        f"{len(os.sched_getaffinity(0))} CPUs, loopback; load average {os.getloadavg()[0]:.1f}"
    )
    print(f"in-process ceiling: {ceiling.describe()}")
    print(
        f"{'':18}{'ex/s':>8}{'/ceiling':>10}{'/off':>7}{'p50 ms':>9}{'p99 ms':>9}{'batch':>7}"
        f"{'client CPU':>12}{'server CPU':>12}"
    )
    for r in (floor, *results):
        print(
            f"{r.name:18}{r.examples_per_s:8.0f}{r.examples_per_s / ceiling.examples_per_s:10.3f}"
            f"{r.examples_per_s / off.examples_per_s:7.1f}{r.p50_ms:9.2f}{r.p99_ms:9.2f}{r.mean_batch:7.1f}"
            f"{r.client_cpu:12.2f}{r.server_cpu:12.2f}" + (f"  ({r.errors} errors)" if r.errors else "")
        )
    best = max(results[1:], key=lambda r: r.examples_per_s)
    print("(CPU: seconds per second of wall time, 1.00 = one core busy)")
    print(f"best batching on ({best.name}) vs off: {best.examples_per_s / off.examples_per_s:.1f}x (target >= 5x)")
    print(f"best batching on vs ceiling: {best.examples_per_s / ceiling.examples_per_s:.2f}x (target >= 0.25x)")
    print(
        f"best batching on vs the gRPC floor: {best.examples_per_s / floor.examples_per_s:.2f}x; the floor itself is "
        f"{floor.examples_per_s / off.examples_per_s:.1f}x off and {floor.examples_per_s / ceiling.examples_per_s:.2f}x"
        " the ceiling: serve-local, one Python gRPC process, cannot pass it on these cores"
    )
    print(f"p99 on/off: {best.p99_ms / off.p99_ms:.2f} (target <= 1)")
    print(f"batching off: {off.examples_per_s:.0f} ex/s; before grpc.aio: {BEFORE_OFF} ex/s (target: no slower)")


if __name__ == "__main__":
    main()
