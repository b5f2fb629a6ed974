"""Write a servable SavedModel with the serving signature (warmup and metadata: `trainserve.layout`).

Signature `serving_default`: the data's named inputs with the data's dtypes (a CSV's raw columns: string
categories, float32 numbers with NaN for missing); outputs by task: classification -> `probabilities`
(float32 [None, K]; one sigmoid unit becomes [1 - p, p], K = 2) and `classes` (int64 [None]), plus, when the
classes have names, `class_names` (string [None]) and `label_names` (string [None, K], each column's name);
regression -> `predictions` (float32 [None, T]). A model trained on image files takes their bytes instead:
`image_bytes` (string [None]), decoded inside the graph; `serving_pixels` takes decoded uint8 images.
Tabular models with category columns also answer `unknown_categories` (int64 [None]: cells holding a value
training never saw, served via the OOV bucket).

`export_and_gate` rebuilds the model with its `--model-fn` function under the float32 policy, loads the
trained weights, exports and runs the CPU gate, all where no GPU is visible. Keras RNN layers pick cuDNN
kernels whenever a GPU is visible, and such a SavedModel fails on a CPU server (tensorflow#77442,
keras#18504); traced where no GPU exists, no GPU kernel or device can reach the graph. A training process
with no GPU does it in process; one with GPUs starts one child that sees none:
`python -m trainserve.training.export DIR OUT`, DIR holding job.json, sample.npz, weights.npz, golden.npz.
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

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
)
from trainserve.task import Task
from trainserve.training.gate import GateResult, GoldenBatch, check_on_cpu, result_from_output, run_without_gpu


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


def export_savedmodel(model, path: Path, inputs, task: Task, preprocessing=None, image=None) -> None:
    """Export `model` (float32) with the serving signature; no device scope, so no node is pinned.
    `inputs`: the InputSpecs of the data; `preprocessing`: the tabular plan, whose category vocabularies count
    unknown values; `image` (an ImageFormat): the model was trained on image files, and its signatures take
    them (see `_add_image_endpoints`)."""
    import keras
    import tensorflow as tf

    from trainserve.training.model_fn import input_structure
    from trainserve.training.preprocessing import counts_unknown_categories, unknown_categories

    model_dtypes = {t.name: t.dtype for t in model.inputs}
    names, structure = [i.name for i in inputs], input_structure(model)
    archive = keras.export.ExportArchive()
    archive.track(model)
    if image is not None:
        _add_image_endpoints(archive, model, task, image)
        archive.write_out(str(path), verbose=False)
        return

    def serve(*args):
        feed = {name: tf.cast(arg, model_dtypes[name]) for name, arg in zip(names, args)}
        outputs = serving_outputs(model(structure(feed), training=False), task)
        if counts_unknown_categories(preprocessing):
            outputs[UNKNOWN_CATEGORIES] = unknown_categories(preprocessing, feed)
        return outputs

    archive.add_endpoint(
        name=DEFAULT_SIGNATURE,
        fn=serve,
        input_signature=[tf.TensorSpec([None, *i.shape], tf.as_dtype(i.dtype), name=i.name) for i in inputs],
    )
    archive.write_out(str(path), verbose=False)


def _add_image_endpoints(archive, model, task: Task, image) -> None:
    """`serving_default`: `image_bytes` (DT_STRING [N], the files' bytes) decoded and resized by the function
    training used (training/images.py); `serving_pixels`: `images` (uint8 [N, H', W', C], any size, decoded
    already) resized alike. Both answer the task's outputs."""
    import tensorflow as tf

    from trainserve.data import IMAGES
    from trainserve.sources.image_folder import IMAGE_BYTES
    from trainserve.training.images import PIXELS_SIGNATURE, decode_batch, resize
    from trainserve.training.model_fn import input_structure

    structure, dtype = input_structure(model), model.inputs[0].dtype
    resized = tf.TensorSpec([None, image.height, image.width, image.channels], tf.uint8)

    # One traced function both signatures call: the network is traced once, not once per signature.
    @tf.function(input_signature=[resized], autograph=False)
    def answer(pixels):
        return serving_outputs(model(structure({IMAGES: tf.cast(pixels, dtype)}), training=False), task)

    archive.add_endpoint(
        name=DEFAULT_SIGNATURE,
        fn=lambda encoded: answer(decode_batch(encoded, image)),
        input_signature=[tf.TensorSpec([None], tf.string, name=IMAGE_BYTES)],
    )
    archive.add_endpoint(
        name=PIXELS_SIGNATURE,
        fn=lambda pixels: answer(resize(pixels, image)),
        input_signature=[tf.TensorSpec([None, None, None, image.channels], tf.uint8, name=IMAGES)],
    )


@dataclass
class ExportJob:
    """What the export needs: the model's function and data spec, the trained weights, and what the CPU gate
    compares the exported version with."""

    reference: str
    spec: Any  # model_fn.DataSpec
    weights: list[np.ndarray]
    golden: GoldenBatch
    atol: float


def export_and_gate(job: ExportJob, path: Path, *, in_process: bool) -> GateResult:
    """Export a float32 rebuild of the trained model to `path` and run the CPU gate on it.

    `in_process` only where this process sees no GPU (nothing could reach the graph); otherwise both steps
    run in one child process that sees none.
    """
    if in_process:
        return _export_and_check(job, path)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        described = {"reference": job.reference, **job.spec.to_json(), "atol": job.atol}
        (work / "job.json").write_text(json.dumps(described))
        np.savez(work / "sample.npz", **job.spec.sample)
        np.savez(work / "weights.npz", *job.weights)
        job.golden.save(work / "golden.npz")
        proc = run_without_gpu(["-m", "trainserve.training.export", str(work), str(path)])
    return result_from_output(proc)


def _export_and_check(job: ExportJob, path: Path) -> GateResult:
    from trainserve.training.model import rebuild_float32

    try:
        model = rebuild_float32(job.reference, job.spec, job.weights)
        export_savedmodel(model, path, job.spec.inputs, job.spec.task, job.spec.preprocessing, job.spec.image)
    except TrainserveError as exc:
        return GateResult(False, f"the export failed: {exc}")
    return check_on_cpu(path, job.golden, job.atol)


def _job_from_files(work: Path) -> ExportJob:
    from trainserve.training.model_fn import DataSpec

    raw = json.loads((work / "job.json").read_text())
    with np.load(work / "sample.npz") as npz:
        sample = {k: npz[k] for k in npz.files}
    with np.load(work / "weights.npz") as npz:
        weights = [npz[f"arr_{i}"] for i in range(len(npz.files))]
    spec = DataSpec.from_json(raw, sample)
    return ExportJob(raw["reference"], spec, weights, GoldenBatch.load(work / "golden.npz"), raw["atol"])


def main(argv: list[str] | None = None) -> int:
    """The child: export, gate, and print the gate's result as one JSON line."""
    work, out = (Path(a) for a in (argv or sys.argv[1:]))
    result = _export_and_check(_job_from_files(work), out)
    print(json.dumps(asdict(result)), flush=True)
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
