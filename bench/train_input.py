"""Training throughput: trainserve's input pipeline vs the seeds' `model.fit(numpy arrays)`.

Same model, same data, same batch size, one process, alternating runs; prints examples/s of each and
the ratio (ours / baseline). With a GPU it also compares our mixed-precision run with the seed-style
float32 fit under `tf.device('/GPU:0')` (target >= 2x). Never part of the pass/fail test run.

    python bench/train_input.py [--size 20000] [--epochs 3] [--repeats 2]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from trainserve.sources import SyntheticSpec, load_dataset  # noqa: E402
from trainserve.training.callbacks import ThroughputCallback  # noqa: E402
from trainserve.training.model import build_network  # noqa: E402
from trainserve.training.model_fn import data_spec  # noqa: E402
from trainserve.training.pipeline import make_input_pipeline  # noqa: E402


def run(policy: str, pipeline: bool, data, batch: int, epochs: int, device: str | None) -> float:
    keras.config.set_dtype_policy(policy)
    keras.utils.set_random_seed(0)
    model = build_network("cnn", data_spec(data.train, data.task))
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    meter = ThroughputCallback(len(data.x_train))
    if pipeline:
        ds = make_input_pipeline(data.x_train, data.y_train, batch, seed=0, training=True)
        model.fit(ds, epochs=1, verbose=0, shuffle=False)  # warm-up: tracing and cache fill
        model.fit(ds, epochs=epochs, verbose=0, shuffle=False, callbacks=[meter])
    else:
        # The seeds: float arrays in host memory, Keras slices them each step.
        x = data.x_train.astype(np.float32) / 255.0
        with tf.device(device) if device else contextlib.nullcontext():
            model.fit(x, data.y_train, batch_size=batch, epochs=1, verbose=0)
            model.fit(x, data.y_train, batch_size=batch, epochs=epochs, verbose=0, callbacks=[meter])
    keras.config.set_dtype_policy("float32")
    return meter.examples_per_second


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=20000, help="synthetic 28x28x1 examples")
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs per run")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs of each")
    args = parser.parse_args()
    data = load_dataset("synthetic", SyntheticSpec(size=args.size))
    ours, base = [], []
    for _ in range(args.repeats):
        ours.append(run("float32", True, data, args.batch_size, args.epochs, None))
        base.append(run("float32", False, data, args.batch_size, args.epochs, None))
    o, b = statistics.median(ours), statistics.median(base)
    print(f"CPU float32, batch {args.batch_size}, {len(data.x_train)} examples, {args.epochs} epochs x {args.repeats}")
    print(f"  ours (tf.data pipeline)        {o:10.0f} ex/s")
    print(f"  seed (model.fit numpy arrays)  {b:10.0f} ex/s")
    print(f"  ratio ours/seed                {o / b:10.2f}x")
    if tf.config.list_physical_devices("GPU"):
        mixed = run("mixed_float16", True, data, args.batch_size, args.epochs, None)
        fp32 = run("float32", False, data, args.batch_size, args.epochs, "/GPU:0")
        print(f"GPU: ours mixed precision {mixed:.0f} ex/s vs seed fp32 /GPU:0 {fp32:.0f} ex/s: {mixed / fp32:.2f}x")
    else:
        print("GPU: none visible, mixed-precision GPU comparison not run")


if __name__ == "__main__":
    main()
