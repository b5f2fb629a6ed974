"""Building the model to train: the `--model-fn` function (built-ins included), compiled for the task,
wrapped for gradient accumulation; and the float32 rebuild that export uses.
"""

from __future__ import annotations

import logging

import keras
import numpy as np

from trainserve.errors import TrainserveError
from trainserve.task import Task
from trainserve.training import model_fn
from trainserve.training.model_fn import DataSpec
from trainserve.training.preprocessing import FEATURES, feature_layers

log = logging.getLogger(__name__)


class GradientAccumulationModel(keras.Model):
    """Splits each replica's batch into `micro_batches` slices, sums their gradients, applies once.

    Peak activation memory is that of one slice, the update that of the whole batch. Keras' own
    `gradient_accumulation_steps` applies gradients inside a conditional, which MirroredStrategy rejects
    (merge_call inside a cond); here the single apply per step stays outside any control flow.
    """

    def __init__(self, *args, micro_batches: int = 1, **kwargs):
        super().__init__(*args, **kwargs)
        self.micro_batches = micro_batches

    def train_step(self, data):
        """Keras' own train_step (keras/src/backend/tensorflow/trainer.py), sliced: public API only.

        One convention of Keras' is mirrored rather than called: under tf.distribute, `compute_loss` returns
        the replica's share of the global mean (divided by the replicas in sync), and the `loss` metric is
        fed that share times the replicas. Keras' own helper for it is internal
        (keras.src.losses.loss.unscale_loss_for_distribution). tests/test_model.py checks the reported
        loss and the weights against Keras' own step, without and with MirroredStrategy: a Keras release
        that changes the convention fails there.
        """
        import tensorflow as tf

        x, y = data[0], data[1]
        size = tf.shape(tf.nest.flatten(x)[0])[0]
        weights = self.trainable_weights
        loss_metric = next(m for m in self.metrics if m.name == "loss")  # Keras' loss tracker, first in metrics
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        total = None
        for i in range(self.micro_batches):
            start, end = (size * i) // self.micro_batches, (size * (i + 1)) // self.micro_batches
            xs, ys = tf.nest.map_structure(lambda t, a=start, b=end: t[a:b], x), y[start:end]
            share = tf.cast(end - start, tf.float32) / tf.cast(size, tf.float32)
            with tf.GradientTape() as tape:
                y_pred = self(xs, training=True)
                loss = self.compute_loss(x=xs, y=ys, y_pred=y_pred, training=True)
                loss_metric.update_state(loss * tf.cast(replicas, loss.dtype), sample_weight=end - start)
                scaled = self.optimizer.scale_loss(loss * tf.cast(share, loss.dtype))
            grads = tape.gradient(scaled, weights)
            total = grads if total is None else [a + b for a, b in zip(total, grads)]
            metrics = self.compute_metrics(xs, ys, y_pred)
        self.optimizer.apply_gradients(zip(total, weights))
        return metrics


def build_network(reference: str, spec: DataSpec) -> keras.Model:
    """The model `reference` builds; for tabular data behind the preprocessing layers, so it takes the raw
    columns (unless the function asked for them itself: `raw_inputs = True`)."""
    function = model_fn.resolve(reference)
    if spec.preprocessing is None or model_fn.wants_raw_inputs(function):
        return model_fn.build(reference, spec, function)
    inner = model_fn.build(reference, spec.features_spec(), function)
    raw = spec.keras_inputs()
    features = feature_layers(spec.preprocessing, raw)
    outputs = inner(model_fn.input_structure(inner)({FEATURES: features}))
    return keras.Model(raw, outputs, name=inner.name)


def task_loss(task: Task, units: int) -> str:
    """The loss trainserve compiles with: cross-entropy on probabilities (binary for one sigmoid unit), MSE."""
    if task.kind == "regression":
        return "mean_squared_error"
    return "binary_crossentropy" if units == 1 else "sparse_categorical_crossentropy"


def build_for_training(
    reference: str, spec: DataSpec, learning_rate: float, grad_accum: int = 1, compile: bool = True
) -> keras.Model:
    """The model `reference` builds for `spec` (call under the strategy scope), ready for `fit`: the user's
    compile kept, or Adam with the task's loss and metrics; wrapped to accumulate gradients over K slices."""
    model = build_network(reference, spec)
    config = _compile_config(model)
    if grad_accum > 1:
        try:
            model = GradientAccumulationModel(model.input, model.output, name=model.name, micro_batches=grad_accum)
        except Exception as exc:
            raise TrainserveError(
                f"--grad-accum {grad_accum} with --model-fn {reference!r}: {type(exc).__name__}: {exc}:"
                " expected a functional model (keras.Model(inputs, outputs))"
            ) from None
    if not compile:
        return model
    if config is not None:
        if grad_accum > 1 or not getattr(model, "compiled", False):
            model.compile_from_config(config)  # a new wrapper: the inner model's compile, carried over
        build_optimizer(model)
        return model
    units = int(model.outputs[0].shape[-1]) if len(model.outputs[0].shape) == 2 else 1
    metrics = ["accuracy"] if spec.task.kind == "classification" else ["mean_absolute_error"]
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss=task_loss(spec.task, units), metrics=metrics)
    build_optimizer(model)
    return model


def build_optimizer(model: keras.Model) -> None:
    """Create the compiled optimizer's variables now, under the model's strategy, as fit would on its first
    step. Outside a strategy (training on a CPU) fit creates them inside its first traced step, and
    TensorFlow then traces that step twice: seconds for a large network (MobileNetV3's first fine-tuning epoch on
    a CPU: 16 s -> 11 s)."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built:
        with model.distribute_strategy.scope():
            optimizer.build(model.trainable_variables)


def fit_built(model: keras.Model, data, **fit_args):
    """`model.fit(data, **fit_args)` with the compiled loss's and metrics' state built first (`build_compiled`)."""
    build_compiled(model, data)
    return model.fit(data, **fit_args)


def build_compiled(model: keras.Model, data) -> None:
    """Create the compiled loss's and metrics' state now, from the dataset's element spec, as fit does first under
    a distribution strategy. Without one (training on a CPU) fit creates it inside its first traced step, and
    TensorFlow then traces that step twice (MobileNetV3's fine-tuning epoch: seconds). Keras has no public call for
    it: `Model._symbolic_build` (Keras 3). A Keras without it, or where it fails, trains as before: fit builds
    that state in its first step, traced twice."""
    build = getattr(model, "_symbolic_build", None)
    spec = getattr(data, "element_spec", None)
    if not callable(build) or spec is None:
        return
    try:
        with model.distribute_strategy.scope():
            build(data_batch=spec)
    except Exception as exc:  # a private call: any failure leaves it to fit, as before
        log.debug("compiled state left to fit's first step (%s: %s)", type(exc).__name__, exc)


def _compile_config(model: keras.Model) -> dict | None:
    """The user's compile of `model`, or of the model behind the preprocessing layers; None: uncompiled."""
    for candidate in (model, *model.layers):
        if isinstance(candidate, keras.Model) and getattr(candidate, "compiled", False):
            return candidate.get_compile_config()
    return None


def rebuild_float32(reference: str, spec: DataSpec, weights: list[np.ndarray]) -> keras.Model:
    """The same network rebuilt by its function under the float32 policy, outside any strategy, with the
    trained weights copied in.

    A mixed_float16 model exported as is computes in fp16 on the CPU server, which is slow there
    (tensorflow#45441); its variables are float32 already, so the weights copy over exactly. A model
    built under a strategy holds distributed variables; the rebuild holds plain ones.
    """
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float32")
    try:
        clone = build_network(reference, spec)
    finally:
        keras.config.set_dtype_policy(previous)
    try:
        clone.set_weights(weights)
    except ValueError as exc:
        raise TrainserveError(
            f"--model-fn {reference!r} built a different model the second time ({exc}): expected the same"
            " network for the same spec (no randomness in its structure)"
        ) from None
    return clone
