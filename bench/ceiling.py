"""The in-process ceiling both serving benchmarks compare against: the SavedModel's signature called
directly, best over batch sizes and over 1, 2 and 4 threads calling at once (a server runs batches
concurrently, so a ceiling measured on one thread can be beaten by the server it bounds)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainserve.savedmodel import LoadedModel

THREADS = (1, 2, 4)


@dataclass(frozen=True)
class Ceiling:
    examples_per_s: float
    batch: int
    threads: int

    def describe(self) -> str:
        return f"{self.examples_per_s:.0f} ex/s (batch {self.batch}, {self.threads} thread(s))"


def rate(model: LoadedModel, x: np.ndarray, batch: int, threads: int, input_name: str = "images") -> float:
    """Examples/s through `model` with `threads` threads each calling it on batches of `batch`, after a warm-up."""
    chunks = [x[start : start + batch] for start in range(0, len(x), batch)]
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda c: model.run("serving_default", {input_name: c}), chunks[:threads]))
        started = time.perf_counter()
        list(pool.map(lambda c: model.run("serving_default", {input_name: c}), chunks))
        return len(x) / (time.perf_counter() - started)


def in_process_ceiling(
    version_dir: Path, x: np.ndarray, batches: tuple[int, ...], input_name: str = "images"
) -> Ceiling:
    """The best of every batch size in `batches` and 1, 2 and 4 threads, on the served signature's one input."""
    model = LoadedModel(version_dir)
    try:
        return max(
            (
                Ceiling(rate(model, x, batch, threads, input_name), batch, threads)
                for batch in batches
                for threads in THREADS
            ),
            key=lambda c: c.examples_per_s,
        )
    finally:
        model.close()
