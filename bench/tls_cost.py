"""What mutual TLS costs `trainserve eval`: examples/s over mutual TLS against plaintext, in one run.

One published model (the small CNN on 28x28x1 uint8 of bench/eval_throughput.py), two serve-local processes on
it: one plaintext, one with an SSLConfig that requires client certificates (`make certs`' development set).
TLS and plaintext cannot share a gRPC port, so each has its own; an idle server costs nothing. `trainserve eval`
at its defaults (batch 256, 4 in flight), each run in its own process as users run it, on the same held-out
file, alternating plaintext and mutual TLS (and which goes first) so that both see the same machine. The first
pair warms both servers and is dropped; the ratio is the median of the pairs' ratios.
Target: mutual TLS >= 0.85 x plaintext examples/s (issue 33).

    python bench/tls_cost.py [--examples 20000] [--pairs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from google.protobuf import text_format
from loopback import start_serve_local, train_bench_model

from trainserve.protos import ssl_config_pb2
from trainserve.sources.synthetic import SyntheticSpec, synthetic_examples

REPO = Path(__file__).resolve().parents[1]
SPEC = SyntheticSpec((28, 28, 1), 10)


def write_ssl_config(certs: Path) -> Path:
    """serve-local's --ssl_config_file: the server's pair, and the CA that client certificates must chain to."""
    config = ssl_config_pb2.SSLConfig(
        server_cert=(certs / "server" / "tls.crt").read_text(),
        server_key=(certs / "server" / "tls.key").read_text(),
        custom_ca=(certs / "ca.crt").read_text(),
        client_verify=True,
    )
    (certs / "ssl.config").write_text(text_format.MessageToString(config))
    return certs / "ssl.config"


def start_server(models: Path, log: Path, *flags: str) -> tuple[subprocess.Popen, str]:
    server, port, _ = start_serve_local(log, "--model_name=bench", f"--model_base_path={models}", *flags)
    return server, f"127.0.0.1:{port}"


def eval_examples_per_s(target: str, data: Path, report: Path, *tls: str) -> float:
    """One `trainserve eval` process at its default batch size and concurrency; its examples/s."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainserve",
            "eval",
            "--server",
            target,
            "--model",
            "bench",
            "--data",
            str(data),
            "--report",
            str(report),
            "--wait",
            "120",
            *tls,
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SystemExit(f"trainserve eval {' '.join(tls) or '(plaintext)'} failed ({proc.returncode}):\n{proc.stderr}")
    return json.loads(report.read_text())["performance"]["examples_per_s"]


def alternate(tmp: Path, tls: tuple[str, ...], pairs: int) -> dict[str, list[float]]:
    """examples/s of each `trainserve eval`, by transport: the two servers started, then `pairs` pairs after one
    warm-up pair (dropped), alternating which transport goes first."""
    models = tmp / "models" / "bench"
    plain, plain_target = start_server(models, tmp / "plain.log")
    ssl_config = write_ssl_config(tmp / "certs")
    mutual, tls_target = start_server(models, tmp / "tls.log", f"--ssl_config_file={ssl_config}")
    runs = {"plaintext": (plain_target, ()), "mutual TLS": (tls_target, tls)}
    speeds: dict[str, list[float]] = {name: [] for name in runs}
    try:
        for pair in range(pairs + 1):
            for name in list(runs) if pair % 2 == 0 else list(reversed(runs)):
                target, flags = runs[name]
                speeds[name].append(eval_examples_per_s(target, tmp / "heldout.npz", tmp / "r.json", *flags))
    finally:
        for server in (plain, mutual):
            server.terminate()
            server.wait(timeout=60)
    return {name: values[1:] for name, values in speeds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=20000, help="held-out examples per evaluation")
    parser.add_argument("--pairs", type=int, default=5, help="plaintext/mutual-TLS pairs measured (after one warm-up)")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        train_bench_model(tmp)
        runpy.run_path(str(REPO / "scripts" / "certs.py"))["write_development_set"](tmp / "certs")
        client = tmp / "certs" / "client"
        tls = ("--tls-ca", f"{client}/ca.crt", "--tls-cert", f"{client}/tls.crt", "--tls-key", f"{client}/tls.key")
        x, y = synthetic_examples(SPEC, args.examples, seed=1)
        np.savez(tmp / "heldout.npz", x_test=x, y_test=y)  # uncompressed, streamed, as a user's file is

        speeds = alternate(tmp, tls, args.pairs)
        plain_speeds, tls_speeds = speeds["plaintext"], speeds["mutual TLS"]
        ratio = statistics.median(t / p for t, p in zip(tls_speeds, plain_speeds, strict=True))
        cores = len(os.sched_getaffinity(0))
        print(f"\n{args.examples} examples, 28x28x1 uint8, small CNN, {cores} CPUs, loopback, batch 256, 4 in flight")
        for name, values in (("plaintext", plain_speeds), ("mutual TLS", tls_speeds)):
            print(
                f"  {name:<11} {statistics.median(values):8.0f} ex/s  (runs: {', '.join(f'{v:.0f}' for v in values)})"
            )
        print(
            f"  mutual TLS / plaintext = {ratio:.2f}, median of {len(plain_speeds)} alternated pairs (target >= 0.85)"
        )


if __name__ == "__main__":
    main()
