"""The Keras models: a small CNN (default) and an MLP, taking float32 images in [0, 1].

The softmax is its own layer with dtype float32, so under mixed_float16 the probabilities are still
computed in float32 (Keras' mixed-precision guide: fp16 softmax loses too much precision).
"""

from __future__ import annotations

import keras

from trainserve.errors import TrainserveError
from trainserve.training.config import ARCHITECTURES, Architecture


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
        import tensorflow as tf
        from keras.src.losses.loss import unscale_loss_for_distribution

        x, y = data[0], data[1]
        size = tf.shape(x)[0]
        weights = self.trainable_weights
        total = None
        for i in range(self.micro_batches):
            start, end = (size * i) // self.micro_batches, (size * (i + 1)) // self.micro_batches
            xs, ys = x[start:end], y[start:end]
            share = tf.cast(end - start, tf.float32) / tf.cast(size, tf.float32)
            with tf.GradientTape() as tape:
                y_pred = self(xs, training=True)
                loss = self._compute_loss(x=xs, y=ys, y_pred=y_pred, training=True)
                self._loss_tracker.update_state(unscale_loss_for_distribution(loss), sample_weight=end - start)
                scaled = self.optimizer.scale_loss(loss * tf.cast(share, loss.dtype))
            grads = tape.gradient(scaled, weights)
            total = grads if total is None else [a + b for a, b in zip(total, grads)]
            metrics = self.compute_metrics(xs, ys, y_pred)
        self.optimizer.apply_gradients(zip(total, weights))
        return metrics


def build_model(
    architecture: Architecture, input_shape: tuple[int, int, int], num_classes: int, grad_accum: int = 1
) -> keras.Model:
    """A fresh, uncompiled model under the current Keras dtype policy."""
    inputs = keras.Input(shape=input_shape, name="images")
    if architecture == "cnn":
        # Keras' mnist_convnet example with half the filters: pooling after each conv keeps the compute
        # small enough for cheap CPU serving (docs/serving-on-cpus.md has the numbers).
        x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
        x = keras.layers.MaxPooling2D(2)(x) if min(input_shape[:2]) >= 2 else x
        x = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(x)
        x = keras.layers.MaxPooling2D(2)(x) if min(input_shape[:2]) >= 4 else x
        x = keras.layers.Flatten()(x)
        x = keras.layers.Dropout(0.5)(x)
    elif architecture == "mlp":
        x = keras.layers.Flatten()(inputs)
        x = keras.layers.Dense(256, activation="relu")(x)
        x = keras.layers.Dropout(0.2)(x)
        x = keras.layers.Dense(128, activation="relu")(x)
    else:
        raise TrainserveError(f"--architecture {architecture!r}: expected one of {', '.join(ARCHITECTURES)}")
    logits = keras.layers.Dense(num_classes, name="logits")(x)
    outputs = keras.layers.Activation("softmax", dtype="float32", name="probabilities")(logits)
    name = f"trainserve_{architecture}"
    if grad_accum > 1:
        return GradientAccumulationModel(inputs, outputs, name=name, micro_batches=grad_accum)
    return keras.Model(inputs, outputs, name=name)


def float32_copy(model: keras.Model, architecture: Architecture) -> keras.Model:
    """The same network rebuilt under the float32 policy, outside any distribution strategy, with the
    trained weights copied in.

    A mixed_float16 model exported as is computes in fp16 on the CPU server, which is slow there
    (tensorflow#45441); its variables are float32 already, so the weights copy over exactly. A model
    built under a strategy holds distributed variables; the copy holds plain ones.
    """
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float32")
    try:
        clone = build_model(architecture, tuple(model.input_shape[1:]), int(model.output_shape[-1]))
    finally:
        keras.config.set_dtype_policy(previous)
    clone.set_weights(model.get_weights())
    return clone
