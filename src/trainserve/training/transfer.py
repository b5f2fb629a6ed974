"""Transfer learning as people train image models: a Keras Applications backbone, a new head.

`--architecture mobilenet_v3_small | efficientnet_b0 | resnet50` are `--model-fn` functions like the others:
the backbone is built for the data's `--image-size` (include_top=False, global average pooling) behind its
own input preprocessing (MobileNetV3 and EfficientNet carry theirs as layers; ResNet50's caffe-style BGR mean
subtraction is a layer here), so the served graph takes the same uint8 pixels as any trainserve model.
The functions build random weights; training loads `--weights` into the layer named `backbone` afterwards
(`load_backbone_weights`), so the float32 rebuild for export never downloads anything.
Fitting keeps the backbone frozen for `--frozen-epochs`, then fine-tunes everything at a lower learning rate.
"""

from __future__ import annotations

import logging
from pathlib import Path

from trainserve.errors import TrainserveError

log = logging.getLogger(__name__)

BACKBONE = "backbone"
TRANSFER_SIZES = {"mobilenet_v3_small": (224, 224), "efficientnet_b0": (224, 224), "resnet50": (224, 224)}
MIN_SIDE = 32  # the smallest input Keras Applications build these backbones for


def _application(name: str):
    import keras

    return {
        "mobilenet_v3_small": lambda **kw: keras.applications.MobileNetV3Small(include_preprocessing=True, **kw),
        "efficientnet_b0": keras.applications.EfficientNetB0,
        "resnet50": keras.applications.ResNet50,
    }[name]


def backbone(name: str, shape: tuple[int, int, int], weights: str | None = None):
    """The Keras Applications network without its top, pooled to one vector per image."""
    if shape[-1] != 3 or min(shape[:2]) < MIN_SIDE:
        raise TrainserveError(
            f"--architecture {name} takes RGB images of at least {MIN_SIDE}x{MIN_SIDE}: got {list(shape)}"
            " (--image-size H,W)"
        )
    try:
        net = _application(name)(input_shape=shape, include_top=False, weights=weights, pooling="avg")
    except Exception as exc:  # an offline imagenet download ends here too
        raise TrainserveError(
            f"--architecture {name}: building the backbone failed: {type(exc).__name__}: {exc}"
        ) from None
    net.name = BACKBONE
    return net


def _transfer_model(name: str, spec):
    import keras

    if spec.image is None or spec.task.kind != "classification":
        raise TrainserveError(
            f"--architecture {name} classifies images: expected --data DIR/ (a folder of images per class)"
        )
    (image,) = spec.inputs
    inputs = keras.Input(shape=image.shape, name=image.name)
    x = CaffeStyle(name="caffe_bgr_mean")(inputs) if name == "resnet50" else inputs
    x = backbone(name, tuple(image.shape))(x, training=False)  # batch norm stays in inference mode when unfrozen
    x = keras.layers.Dropout(0.2)(x)
    logits = keras.layers.Dense(spec.task.classes, name="logits")(x)
    outputs = keras.layers.Activation("softmax", dtype="float32", name="probabilities")(logits)
    return keras.Model(inputs, outputs, name=f"trainserve_{name}")


def mobilenet_v3_small(spec):
    return _transfer_model("mobilenet_v3_small", spec)


def efficientnet_b0(spec):
    return _transfer_model("efficientnet_b0", spec)


def resnet50(spec):
    return _transfer_model("resnet50", spec)


def _caffe_style_layer():
    import keras

    class CaffeStyleLayer(keras.layers.Layer):
        """RGB [0, 255] -> BGR minus ImageNet's channel means: keras.applications.resnet50.preprocess_input."""

        def call(self, x):
            return keras.ops.flip(keras.ops.cast(x, self.compute_dtype), axis=-1) - keras.ops.convert_to_tensor(
                [103.939, 116.779, 123.68], self.compute_dtype
            )

    return CaffeStyleLayer


def CaffeStyle(**kwargs):  # noqa: N802  (a layer class, made on first use: keras is imported late)
    return _caffe_style_layer()(**kwargs)


def is_transfer(model) -> bool:
    return any(layer.name == BACKBONE for layer in model.layers)


def load_backbone_weights(model, architecture: str, weights: str) -> None:
    """`imagenet` (through Keras' cache), a FILE.weights.h5 saved from such a backbone, or `none` (random)."""
    if not is_transfer(model) or weights == "none":
        return
    layer = model.get_layer(BACKBONE)
    if weights == "imagenet":
        pretrained = backbone(architecture, tuple(layer.input.shape[1:]), weights="imagenet")
        layer.set_weights(pretrained.get_weights())
    else:
        path = Path(weights)
        if not path.is_file() or not path.name.endswith(".weights.h5"):
            raise TrainserveError(f"--weights {weights}: expected imagenet, none or an existing FILE.weights.h5")
        try:
            layer.load_weights(str(path))
        except Exception as exc:
            raise TrainserveError(
                f"--weights {weights} does not fit the {architecture} backbone ({type(exc).__name__}: {exc}):"
                " expected a file saved from the same architecture and --image-size"
            ) from None
    log.info("backbone weights: %s", weights)


def fit_frozen_then_fine_tuned(model, fit, epochs: int, frozen_epochs: int, fine_tune_lr: float, history) -> None:
    """`fit(epochs=, initial_epoch=)` with the backbone frozen for `frozen_epochs`, then everything trainable
    at `fine_tune_lr` (recompiled: Keras fixes what it trains at compile time). No backbone: one fit."""
    import keras

    from trainserve.training.model import build_optimizer

    if not is_transfer(model) or frozen_epochs == 0:
        fit(epochs=epochs, initial_epoch=0)
        return
    layer = model.get_layer(BACKBONE)
    loss, metrics, learning_rate = model.loss, ["accuracy"], float(model.optimizer.learning_rate.numpy())
    layer.trainable = False
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss=loss, metrics=metrics)
    build_optimizer(model)
    log.info("backbone frozen for %d epoch(s)", min(frozen_epochs, epochs))
    fit(epochs=min(frozen_epochs, epochs), initial_epoch=0)
    if epochs <= frozen_epochs:
        return
    layer.trainable = True
    model.compile(optimizer=keras.optimizers.Adam(fine_tune_lr), loss=loss, metrics=metrics)
    build_optimizer(model)
    log.info("backbone fine-tuned from epoch %d at learning rate %g", frozen_epochs + 1, fine_tune_lr)
    history.append = True  # the CSV keeps the frozen epochs' rows
    fit(epochs=epochs, initial_epoch=frozen_epochs)
