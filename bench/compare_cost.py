"""What a paired comparison costs: `trainserve eval --compare-with 1` of version 2 against `trainserve eval` of
version 2 alone, on the same data, the same server, in one run.

Two versions of a small CNN (synthetic 28x28x1, one epoch each, two seeds) served side by side by serve-local
(`model_version_policy { all {} }`) on loopback. A comparison sends every batch to both versions, both requests
in flight together, so it should cost about one evaluation's time per version the server can run at once, not
the sum of two runs made one after the other; on a server whose cores are already busy with one evaluation, the
second version's work is extra compute and the ratio approaches 2. Target: <= 2.3 x. Prints the medians of the
batch loop's wall time (the report's `performance.wall_s`) and of each command's whole process.

    python bench/compare_cost.py [--examples 10000] [--repeats 3]
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
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
from loopback import start_serve_local, train_bench_model  # noqa: E402

from trainserve.sources.synthetic import SyntheticSpec, synthetic_examples  # noqa: E402

SPEC = SyntheticSpec((28, 28, 1), 10)


def trainserve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainserve", *args], capture_output=True, text=True)


def timed_eval(target: str, report: Path, *args: str) -> tuple[float, float]:
    """(batch-loop wall seconds, whole-process wall seconds) of one `trainserve eval`."""
    started = time.perf_counter()
    proc = trainserve("eval", "--server", target, "--model", "bench", "--version", "2", "--report", str(report), *args)
    elapsed = time.perf_counter() - started
    if proc.returncode not in (0, 1):
        raise SystemExit(proc.stderr)
    return json.loads(report.read_text())["performance"]["wall_s"], elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for seed in (1, 2):  # versions 1 and 2
            train_bench_model(tmp, size=6000, seed=seed)
        x, y = synthetic_examples(SPEC, args.examples, seed=5)
        np.savez(tmp / "heldout.npz", x_test=x, y_test=y)
        config = tmp / "models.config"
        config.write_text(
            f'model_config_list {{ config {{ name: "bench" base_path: "{tmp / "models" / "bench"}" '
            'model_platform: "tensorflow" model_version_policy { all {} } } }\n'
        )
        server, port, _ = start_serve_local(tmp / "server.log", f"--model_config_file={config}")
        try:
            target, data = f"127.0.0.1:{port}", ("--data", str(tmp / "heldout.npz"), "--wait", "120")
            timed_eval(target, tmp / "warm.json", *data, "--compare-with", "1")  # loads both, warms both
            one, both = [], []
            for _ in range(args.repeats):  # interleaved: a slow moment of the machine hits both alike
                one.append(timed_eval(target, tmp / "one.json", *data))
                both.append(timed_eval(target, tmp / "both.json", *data, "--compare-with", "1"))
        finally:
            server.terminate()
            server.wait()
    loop = [statistics.median(r[0] for r in runs) for runs in (one, both)]
    whole = [statistics.median(r[1] for r in runs) for runs in (one, both)]
    cores = len(os.sched_getaffinity(0))
    print(f"\n{args.examples} examples, 28x28x1 uint8, small CNN, {cores} CPUs, loopback, median of {args.repeats}")
    print(f"  eval (version 2 alone)          batch loop {loop[0]:7.2f} s    whole command {whole[0]:7.2f} s")
    print(f"  eval --compare-with 1 (both)    batch loop {loop[1]:7.2f} s    whole command {whole[1]:7.2f} s")
    print(f"  ratio: batch loop {loop[1] / loop[0]:.2f} x, whole command {whole[1] / whole[0]:.2f} x  (target <= 2.3)")


if __name__ == "__main__":
    main()
