"""Memory across version loads: does serve-local's resident memory grow with every version it loads and unloads?

TF Serving users report growth across version loads (tensorflow/serving#1215, #1346, #1664). Here: one model
(the benchmark CNN, trained once), served by serve-local with TF Serving's default policy (the newest version,
`latest { num_versions: 1 }`), under a steady closed-loop load of Predicts for the newest version. Then, N times:
publish the next version (a copy beside the versions, then one rename, as training publishes), wait until it is
AVAILABLE and the previous one has unloaded, delete the previous one's directory, read the server's RSS
(/proc/PID/status VmRSS).

Prints RSS after each version and the slope (MiB per version, least squares) over all versions and over the
second half (past the allocator's warm-up), plus the Predicts answered and failed while versions changed
(availability-preserving transitions should fail none). A number, not a rumour; never pass/fail.

    python bench/soak_versions.py [--versions 50] [--concurrency 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import grpc  # noqa: E402
import numpy as np  # noqa: E402
from loopback import DIRECT, start_serve_local, train_bench_model  # noqa: E402

from trainserve.protos import predict_pb2  # noqa: E402
from trainserve.tensors import to_tensor_proto  # noqa: E402

PREDICT = "/tensorflow.serving.PredictionService/Predict"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def states(rest: str, model: str) -> dict[int, str]:
    try:
        body = json.loads(DIRECT.open(f"{rest}/v1/models/{model}", timeout=10).read())
    except OSError:
        return {}
    return {int(v["version"]): v["state"] for v in body.get("model_version_status", [])}


def wait_until(predicate, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"soak: timed out waiting for {what}")
        time.sleep(0.1)


class Traffic:
    """Closed-loop clients sending one pre-serialized Predict for the newest version, counting outcomes."""

    def __init__(self, target: str, model: str, concurrency: int):
        request = predict_pb2.PredictRequest()
        request.model_spec.name = model
        images = np.random.default_rng(0).integers(0, 256, (8, 28, 28, 1), dtype=np.uint8)
        to_tensor_proto(images, into=request.inputs["images"])
        self.payload = request.SerializeToString()
        self.channel = grpc.insecure_channel(target)
        self.call = self.channel.unary_unary(PREDICT)
        self.ok, self.failed, self.stop = 0, {}, threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(concurrency)]

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self.call(self.payload, timeout=30)
                with self.lock:
                    self.ok += 1
            except grpc.RpcError as exc:
                with self.lock:
                    self.failed[exc.code().name] = self.failed.get(exc.code().name, 0) + 1

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)
        self.channel.close()


def publish(template: Path, base: Path, version: int) -> None:
    staged = base / f".tmp-soak-{version}"
    shutil.copytree(template, staged)
    os.rename(staged, base / str(version))


def slope(values: list[float]) -> float:
    return float(np.polyfit(np.arange(len(values)), values, 1)[0]) if len(values) >= 2 else float("nan")


def soak(root: Path, versions: int, concurrency: int) -> None:
    train_bench_model(root)
    base = root / "models" / "bench"
    template = root / "template"
    shutil.copytree(base / "1", template)
    proc, port, rest_port = start_serve_local(
        root / "serve-local.log", "--model_name=bench", f"--model_base_path={base}", "--file_system_poll_wait_seconds=1"
    )
    rest = f"http://127.0.0.1:{rest_port}"
    traffic = Traffic(f"127.0.0.1:{port}", "bench", concurrency)
    try:
        wait_until(lambda: states(rest, "bench").get(1) == "AVAILABLE", "version 1")
        traffic.start()
        rss = [rss_mib(proc.pid)]
        print(f"{'version':>7} {'RSS MiB':>9} {'load s':>7}  predicts ok / failed", flush=True)
        print(f"{1:>7} {rss[0]:9.1f} {'-':>7}  (serving, load started)", flush=True)
        for version in range(2, versions + 2):
            started = time.perf_counter()
            publish(template, base, version)
            wait_until(
                lambda v=version: (s := states(rest, "bench")).get(v) == "AVAILABLE" and s.get(v - 1) in ("END", None),
                f"version {version} AVAILABLE and {version - 1} unloaded",
            )
            took = time.perf_counter() - started
            shutil.rmtree(base / str(version - 1))
            rss.append(rss_mib(proc.pid))
            print(f"{version:>7} {rss[-1]:9.1f} {took:7.2f}  {traffic.ok} / {traffic.failed or 0}", flush=True)
    finally:
        traffic.close()
        proc.terminate()
        proc.wait(60)
    half = rss[len(rss) // 2 :]
    print(
        f"RSS: {rss[0]:.1f} MiB serving version 1 -> {rss[-1]:.1f} MiB after {versions} more versions; "
        f"slope {slope(rss):+.3f} MiB/version over all, {slope(half):+.3f} MiB/version over the last {len(half)}"
    )
    print(f"Predicts while versions changed: {traffic.ok} answered, failed {traffic.failed or 'none'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--versions", type=int, default=50, help="versions published and unloaded after the first")
    parser.add_argument("--concurrency", type=int, default=2, help="closed-loop clients sending Predicts")
    args = parser.parse_args()
    if args.versions < 2 or args.concurrency < 1:
        sys.exit("soak: expected --versions >= 2 and --concurrency >= 1")
    with tempfile.TemporaryDirectory(prefix="trainserve-soak-") as tmp:
        soak(Path(tmp), args.versions, args.concurrency)


if __name__ == "__main__":
    main()
