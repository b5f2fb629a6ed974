"""Evaluation throughput: `trainserve eval` against the in-process ceiling and the usual clients.

One run, one machine, one published model (a small CNN on 28x28x1 uint8, as docs/serving-on-cpus.md measured),
serve-local on loopback. Prints examples/s and ratios:
  (a) in-process ceiling: the SavedModel's signature called directly at its best batch size
  (b) `trainserve eval` at default settings (batch 256, 4 in flight)
  (c) one example per request, sequential, as TF Serving's mnist_client.py does
  (d) REST JSON `:predict` at batch 256, sequential
Targets: (b) >= 0.90 x (a), (b) >= 40 x (c). Then memory: 1,000,000 synthetic examples through
`trainserve eval` in a child process, peak RSS against its RSS at start (target: within 300 MB).

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
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import grpc  # noqa: E402
import numpy as np  # noqa: E402
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc  # noqa: E402

from trainserve.data import SyntheticSpec, synthetic_examples  # noqa: E402
from trainserve.evaluation.config import EvalConfig  # noqa: E402
from trainserve.evaluation.run import evaluate  # noqa: E402
from trainserve.savedmodel import LoadedModel  # noqa: E402
from trainserve.tensors import to_tensor_proto  # noqa: E402

SPEC = SyntheticSpec((28, 28, 1), 10)


def trainserve(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainserve", *args], check=True, capture_output=True, **kwargs)


def in_process(version_dir: Path, x: np.ndarray) -> tuple[float, int]:
    """(a): best examples/s over batch sizes, each timed after a warm-up pass."""
    model = LoadedModel(version_dir)
    best = (0.0, 0)
    for batch in (64, 128, 256, 512, 1024):
        model.run("serving_default", {"images": x[:batch]})
        started = time.perf_counter()
        for start in range(0, len(x), batch):
            model.run("serving_default", {"images": x[start : start + batch]})
        best = max(best, (len(x) / (time.perf_counter() - started), batch))
    model.close()
    return best


def one_per_request(target: str, x: np.ndarray) -> float:
    """(c): mnist_client.py's loop: one image per Predict, one at a time."""
    stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(target))
    started = time.perf_counter()
    for image in x:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "bench"
        request.inputs["images"].CopyFrom(to_tensor_proto(image[np.newaxis]))
        stub.Predict(request, timeout=10)
    return len(x) / (time.perf_counter() - started)


def rest_json(rest: str, x: np.ndarray, batch: int = 256) -> float:
    """(d): REST `instances` JSON at the eval client's batch size, one request at a time."""
    started = time.perf_counter()
    for start in range(0, len(x), batch):
        body = json.dumps({"instances": x[start : start + batch].tolist()}).encode()
        with urllib.request.urlopen(urllib.request.Request(f"{rest}/v1/models/bench:predict", body), timeout=30) as r:
            json.loads(r.read())
    return len(x) / (time.perf_counter() - started)


def memory_run(server: str, examples: int, report: Path) -> None:
    """`trainserve eval` over `examples` synthetic examples in a child process: its RSS at start and peak."""
    trainserve(
        "eval", "--server", server, "--model", "bench", "--data", "synthetic", "--synthetic-size", str(examples),
        "--report", str(report),
    )  # fmt: skip
    rss = json.loads(report.read_text())["performance"]["client_rss_mb"]
    print(
        f"memory: {examples:,} examples, client RSS {rss['start']:.0f} MB at start, "
        f"peak {rss['peak']:.0f} MB: +{rss['peak'] - rss['start']:.0f} MB (target <= +300 MB)"
    )


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=20000, help="held-out examples for (a), (b), (d)")
    parser.add_argument("--single", type=int, default=1000, help="examples sent one per request for (c)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of (b); the median is reported")
    parser.add_argument("--memory-examples", type=int, default=1_000_000, help="0 skips the memory run")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        print("training the benchmark model (synthetic 28x28x1, CNN, 1 epoch)...", flush=True)
        trainserve(
            "train", "--model-name", "bench", "--data", "synthetic", "--synthetic-size", "12000", "--epochs", "1",
            "--export-base", str(tmp / "models"), "--data-dir", str(tmp / "data"), "--logs-dir", str(tmp / "logs"),
        )  # fmt: skip
        version_dir = tmp / "models" / "bench" / "1"
        x = synthetic_examples(SPEC, args.examples, seed=1)[0]
        ceiling, best_batch = in_process(version_dir, x)

        port, rest_port = free_port(), free_port()
        log = open(tmp / "server.log", "w")  # noqa: SIM115
        server = subprocess.Popen(
            [sys.executable, "-m", "trainserve", "serve-local", f"--port={port}", f"--rest_api_port={rest_port}",
             "--model_name=bench", f"--model_base_path={tmp / 'models' / 'bench'}"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            # (b) reads its data from a file, as a user's run does: an uncompressed npz, streamed.
            y = synthetic_examples(SPEC, args.examples, seed=1)[1]
            np.savez(tmp / "heldout.npz", x_test=x, y_test=y)
            config = EvalConfig(server=f"127.0.0.1:{port}", model="bench", data=str(tmp / "heldout.npz"), wait=120)
            evaluate(config)  # warm-up: connection, server threads
            ours = statistics.median(
                evaluate(config).report["performance"]["examples_per_s"] for _ in range(args.repeats)
            )
            single = one_per_request(f"127.0.0.1:{port}", x[: args.single])
            rest = rest_json(f"http://127.0.0.1:{rest_port}", x)

            print(f"\n{args.examples} examples, 28x28x1 uint8, small CNN, {os.cpu_count()} CPUs, loopback")
            print(f"  (a) in-process signature, best batch {best_batch:<5}  {ceiling:10.0f} ex/s")
            print(f"  (b) trainserve eval (batch 256, 4 in flight)   {ours:10.0f} ex/s")
            print(f"  (c) one example per request (mnist_client)     {single:10.0f} ex/s")
            print(f"  (d) REST JSON :predict, batch 256              {rest:10.0f} ex/s")
            print(f"  (b)/(a) = {ours / ceiling:.2f}  (target >= 0.90)")
            print(f"  (b)/(c) = {ours / single:.1f}  (target >= 40)")
            print(f"  (b)/(d) = {ours / rest:.1f}")

            if args.memory_examples:
                memory_run(f"127.0.0.1:{port}", args.memory_examples, tmp / "memory.json")
        finally:
            server.terminate()
            server.wait(timeout=60)
            log.close()


if __name__ == "__main__":
    main()
