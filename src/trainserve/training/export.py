"""Write a servable SavedModel with the serving signature (warmup and metadata: `trainserve.layout`).

Signature `serving_default`: the data's named inputs with the data's dtypes (a CSV's raw columns: string
categories, float32 numbers with NaN for missing); outputs by task: classification -> `probabilities`
(float32 [None, K]; one sigmoid unit becomes [1 - p, p], K = 2) and `classes` (int64 [None]), plus, when the
classes have names, `class_names` (string [None]) and `label_names` (string [None, K], each column's name);
regression -> `predictions` (float32 [None, T]). Tabular models with category columns also answer
`unknown_categories` (int64 [None]: cells holding a value training never saw, served via the OOV bucket).

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
from trainserve.layout import (
    CLASS_NAMES,
    CLASSES,
    DEFAULT_SIGNATURE,
    LABEL_NAMES,
    PREDICTIONS,
    PROBABILITIES,
    UNKNOWN_CATEGORIES,
    Task,
)


def serving_outputs(y, task: Task) -> dict:
    """The signature's outputs from the model's output `y` (TensorFlow ops: eager in training, traced in export)."""
    import tensorflow as tf

    y = tf.cast(y, tf.float32)
    if task.kind == "regression":
        return {PREDICTIONS: tf.reshape(y, [-1, task.targets])}
    if y.shape.rank == 1 or y.shape[-1] == 1:
        p = tf.reshape(y, [-1, 1])
        y = tf.concat([1.0 - p, p], axis=-1)
    classes = tf.argmax(y, axis=-1, output_type=tf.int64)
    outputs = {PROBABILITIES: y, CLASSES: classes}
    if task.named_classes and len(task.label_names) == y.shape[-1]:
        names = tf.constant(list(task.label_names))
        outputs[CLASS_NAMES] = tf.gather(names, classes)
        outputs[LABEL_NAMES] = tf.tile(names[tf.newaxis, :], tf.stack([tf.shape(y)[0], 1]))
    return outputs


def export_savedmodel(model, path: Path, inputs, task: Task | None = None, preprocessing=None) -> None:
    """Export `model` (float32) with the serving signature; no device scope, so no node is pinned.
    `inputs`: the InputSpecs of the data, or (legacy) the shape of uint8 `images`; `preprocessing`: the
    tabular plan, whose category vocabularies count unknown values."""
    import keras
    import tensorflow as tf

    from trainserve.training.model_fn import InputSpec, input_structure
    from trainserve.training.preprocessing import unknown_categories

    if inputs and isinstance(inputs[0], int):
        inputs = [InputSpec("images", tuple(inputs), "uint8")]
    task = task or Task("classification", classes=int(model.output_shape[-1]))
    model_dtypes = {t.name: t.dtype for t in model.inputs}
    names, structure = [i.name for i in inputs], input_structure(model)
    archive = keras.export.ExportArchive()
    archive.track(model)

    def serve(*args):
        feed = {name: tf.cast(arg, model_dtypes[name]) for name, arg in zip(names, args)}
        outputs = serving_outputs(model(structure(feed), training=False), task)
        if preprocessing is not None and preprocessing.categories:
            outputs[UNKNOWN_CATEGORIES] = unknown_categories(preprocessing, feed)
        return outputs

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
        (work / "spec.json").write_text(json.dumps({"reference": reference, **spec.to_json()}))
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
    from trainserve.training.model_fn import DataSpec

    raw = json.loads((work / "spec.json").read_text())
    with np.load(work / "sample.npz") as npz:
        sample = {k: npz[k] for k in npz.files}
    with np.load(work / "weights.npz") as npz:
        weights = [npz[f"arr_{i}"] for i in range(len(npz.files))]
    spec = DataSpec.from_json(raw, sample)
    model = rebuild_float32(raw["reference"], spec, weights)
    export_savedmodel(model, out, spec.inputs, spec.task, spec.preprocessing)


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
