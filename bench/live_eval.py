"""How fast `trainserve live-eval` joins, and what memory it holds: a capture of 1 M recorded examples (batches of
16, ten classes, two versions, hourly windows) joined to a fixed labels file, beside a capture a quarter of its
size joined to the same labels. Memory follows the labels (arrays of 8-byte keys) and not the capture, which is
streamed: the two peaks should be close. Each join runs in a child process of its own (trainserve's CLI), which
reports its own peak RSS. Seeded: the same files every run.

    python bench/live_eval.py [--examples 1000000] [--labels 200000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from captures import capture_name, prediction_log  # noqa: E402
from trainserve.tfrecord import frame  # noqa: E402

BATCH, CLASSES, PER_FILE = 16, 10, 20_000


def write_capture(directory: Path, examples: int, seed: int = 0) -> None:
    """`examples` rows in requests of BATCH, each answered by version 1 or 2, one request a second."""
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True)
    records = []
    for i in range(examples // BATCH):
        probabilities = rng.dirichlet(np.full(CLASSES, 0.3), size=BATCH).astype(np.float32)
        records.append(
            prediction_log(
                "m",
                {"x": np.full((BATCH, 1), i, np.float32)},
                version=1 + i % 2,
                request_id=f"req-{i:08d}",
                timestamp_s=1_790_000_000 + i,
                outputs={"probabilities": probabilities},
            )
        )
        if len(records) == PER_FILE:
            (directory / capture_name(i // PER_FILE)).write_bytes(b"".join(frame(r) for r in records))
            records = []
    if records:
        (directory / capture_name(examples // BATCH // PER_FILE + 1)).write_bytes(b"".join(frame(r) for r in records))


def write_labels(path: Path, labels: int, requests: int, seed: int = 1) -> None:
    """`labels` rows for examples of the first `requests` requests (a random subset), random classes."""
    rng = np.random.default_rng(seed)
    chosen = rng.choice(requests * BATCH, size=labels, replace=False)
    classes = rng.integers(CLASSES, size=labels)
    with open(path, "w") as out:
        out.write("request_id,request_row,label\n")
        out.writelines(f"req-{c // BATCH:08d},{c % BATCH},{k}\n" for c, k in zip(chosen, classes))


CHILD = (
    "import resource, sys\n"
    "from trainserve.cli import main\n"
    "code = main(sys.argv[1:])\n"
    "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
    "sys.exit(code)\n"
)


def join(capture: Path, labels: Path, report: Path) -> tuple[float, float]:
    """(seconds, peak RSS in MiB) of one `trainserve live-eval` in a child process of its own."""
    started = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            "live-eval",
            str(capture),
            "--model",
            "m",
            "--data-dir",
            str(report.parent),
            "--labels",
            str(labels),
            "--window",
            "1h",
            "--report",
            str(report),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)},
    )
    seconds = time.perf_counter() - started
    return seconds, int(done.stderr.strip().splitlines()[-1]) / 1024  # ru_maxrss: KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=1_000_000, help="recorded examples in the large capture")
    parser.add_argument("--labels", type=int, default=200_000, help="labelled examples (of the small capture's)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        small, large = args.examples // 4, args.examples
        labels = root / "labels.csv"
        write_labels(labels, min(args.labels, small), small // BATCH)
        results = {}
        for name, size in (("small", small), ("large", large)):  # the smaller first: its peak is read alone
            write_capture(root / name, size)
            results[name] = join(root / name, labels, root / f"{name}.json")
        print(f"{'examples':>10} {'labels':>8} {'seconds':>8} {'examples/s':>11} {'peak RSS MiB':>13}")
        for name, size in (("small", small), ("large", large)):
            seconds, peak = results[name]
            print(f"{size:>10,} {min(args.labels, small):>8,} {seconds:>8.1f} {size / seconds:>11,.0f} {peak:>13.0f}")
        ratio = results["large"][1] / results["small"][1]
        print(f"peak RSS, 4x the capture: x{ratio:.2f} (1.00: memory does not grow with the capture)")


if __name__ == "__main__":
    main()
