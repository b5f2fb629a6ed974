"""Write a servable SavedModel with the serving signature (warmup and metadata: `trainserve.layout`).

Signature `serving_default`: the data's named inputs with the data's dtypes; outputs by task:
classification -> `probabilities` (float32 [None, K]; one sigmoid unit becomes [1 - p, p], K = 2) and
`classes` (int64 [None]); regression -> `predictions` (float32 [None, T]).

`export_on_cpu` traces the export in a child process that sees no GPU: it rebuilds the model with its
`--model-fn` function under the float32 policy and loads the trained weights. Keras RNN layers pick cuDNN
kernels whenever a GPU is visible, and such a SavedModel fails on a CPU server (tensorflow#77442,
keras#18504); traced where no GPU exists, no GPU kernel or device can reach the graph.

`python -m trainserve.training.export DIR` is that child: DIR holds spec.json, sample.npz, weights.npz.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from trainserve.errors import TrainserveError
from trainserve.layout import CLASSES, DEFAULT_SIGNATURE, PREDICTIONS, PROBABILITIES
from trainserve.task import Task


def serving_outputs(y, task: Task) -> dict:
    """The signature's outputs from the model's output `y` (TensorFlow ops: eager in training, traced in export)."""
    import tensorflow as tf

    y = tf.cast(y, tf.float32)
    if task.kind == "regression":
        return {PREDICTIONS: tf.reshape(y, [-1, task.targets])}
    if y.shape.rank == 1 or y.shape[-1] == 1:
        p = tf.reshape(y, [-1, 1])
        y = tf.concat([1.0 - p, p], axis=-1)
    return {PROBABILITIES: y, CLASSES: tf.argmax(y, axis=-1, output_type=tf.int64)}


def export_savedmodel(model, path: Path, inputs, task: Task | None = None) -> None:
    """Export `model` (float32) with the serving signature; no device scope, so no node is pinned.
    `inputs`: the InputSpecs of the data, or (legacy) the shape of uint8 `images`."""
    import keras
    import tensorflow as tf

    from trainserve.training.model_fn import InputSpec, input_structure

    if inputs and isinstance(inputs[0], int):
        inputs = [InputSpec("images", tuple(inputs), "uint8")]
    task = task or Task("classification", classes=int(model.output_shape[-1]))
    model_dtypes = {t.name: t.dtype for t in model.inputs}
    names, structure = [i.name for i in inputs], input_structure(model)
    archive = keras.export.ExportArchive()
    archive.track(model)

    def serve(*args):
        feed = {name: tf.cast(arg, model_dtypes[name]) for name, arg in zip(names, args)}
        return serving_outputs(model(structure(feed), training=False), task)

    archive.add_endpoint(
        name=DEFAULT_SIGNATURE,
        fn=serve,
        input_signature=[tf.TensorSpec([None, *i.shape], tf.as_dtype(i.dtype), name=i.name) for i in inputs],
    )
    archive.write_out(str(path), verbose=False)


def export_on_cpu(reference: str, spec, weights: Sequence[np.ndarray], path: Path) -> None:
    """Rebuild `reference`'s model for `spec` in a child process with no GPU, load `weights`, export to `path`."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        inputs = [{"name": i.name, "shape": list(i.shape), "dtype": i.dtype} for i in spec.inputs]
        (work / "spec.json").write_text(
            json.dumps({"reference": reference, "inputs": inputs, "task": spec.task.to_json()})
        )
        np.savez(work / "sample.npz", **spec.sample)
        np.savez(work / "weights.npz", *weights)
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="-1", TF_CPP_MIN_LOG_LEVEL="2")
        command = [sys.executable, "-m", "trainserve.training.export", str(work), str(path)]
        proc = subprocess.run(command, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.strip().splitlines() if line.strip()] or ["no output"]
        raise TrainserveError(f"export on the CPU failed (exit {proc.returncode}): {lines[-1]}")


def _export_child(work: Path, out: Path) -> None:
    from trainserve.training.model import rebuild_float32
    from trainserve.training.model_fn import DataSpec, InputSpec

    raw = json.loads((work / "spec.json").read_text())
    with np.load(work / "sample.npz") as npz:
        sample = {k: npz[k] for k in npz.files}
    with np.load(work / "weights.npz") as npz:
        weights = [npz[f"arr_{i}"] for i in range(len(npz.files))]
    inputs = tuple(InputSpec(i["name"], tuple(i["shape"]), i["dtype"]) for i in raw["inputs"])
    spec = DataSpec(inputs, Task.from_json(raw["task"]), sample)
    model = rebuild_float32(raw["reference"], spec, weights)
    export_savedmodel(model, out, inputs, spec.task)


def main(argv: list[str] | None = None) -> int:
    work, out = (Path(a) for a in (argv or sys.argv[1:]))
    try:
        _export_child(work, out)
    except TrainserveError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
