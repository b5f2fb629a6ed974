"""Image files in, pixels out: the one preprocessing function training and serving share.

`decode_image(bytes)` -> uint8 [H, W, C], TensorFlow ops only:
  decode     JPEG (RGB, gray, CMYK), PNG (RGB, RGBA, gray, palette, 16-bit), BMP, GIF (the first frame of an
             animation), whichever the bytes are (their format is read from the bytes, not a file name);
             16-bit samples are scaled to 8 bits
  channels   to the model's: gray -> RGB repeats the gray value; RGBA (and gray + alpha) drop the alpha (no
             compositing); RGB -> gray is tf.image.rgb_to_grayscale (ITU-R 601 luma)
  resize     to --image-size H,W, bilinear, without keeping the aspect ratio (a 4:3 photo is squeezed
             to H x W), as keras.utils.image_dataset_from_directory does by default; rounded to uint8
The tf.data pipeline maps it over the files; the export puts it in front of the model, so the served
`serving_default` takes the files' bytes (`image_bytes`, DT_STRING [N]). Scaling to [0, 1] (or a backbone's
own normalisation) is the model's first layer, as for every uint8 image input. `--augment` layers run in the
pipeline only, after decoding: they never reach the exported graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainserve.data import ImageFormat
from trainserve.errors import TrainserveError

AUGMENTATIONS = ("flip", "rotate", "zoom", "contrast")
PIXELS_SIGNATURE = "serving_pixels"  # the exported signature for clients that decoded the image themselves


@dataclass(frozen=True)
class ImagePipeline:
    """How training streams image files: their format, `--augment`, `--cache` ("" none, "memory", or a file)."""

    image: ImageFormat
    augment: tuple[str, ...] = ()
    cache: str = ""


def check_augmentations(names: tuple[str, ...]) -> tuple[str, ...]:
    unknown = [n for n in names if n not in AUGMENTATIONS]
    if unknown:
        raise TrainserveError(f"--augment {','.join(unknown)}: expected some of {','.join(AUGMENTATIONS)}")
    return names


def decode_image(encoded, image: ImageFormat):
    """One encoded image file (a scalar tf.string) -> uint8 [height, width, channels]."""
    import tensorflow as tf

    pixels = tf.io.decode_image(encoded, channels=0, dtype=tf.uint8, expand_animations=False)
    return resize(to_channels(pixels, image.channels), image)


def to_channels(pixels, channels: int):
    """uint8 [H, W, any of 1-4 channels] -> [H, W, channels]: alpha dropped, gray repeated, RGB to luma."""
    import tensorflow as tf

    count = tf.shape(pixels)[-1]
    colour = pixels[..., :3]  # RGB, or RGB of RGBA
    gray = pixels[..., :1]  # gray, or gray of gray + alpha
    rgb = tf.cond(count >= 3, lambda: colour, lambda: tf.tile(gray, [1, 1, 3]))
    rgb = tf.ensure_shape(rgb, [None, None, 3])
    return rgb if channels == 3 else tf.image.rgb_to_grayscale(rgb)


def resize(pixels, image: ImageFormat):
    """uint8 [H, W, C] or [N, H, W, C] -> the same at image.height x image.width (bilinear, no aspect kept)."""
    import tensorflow as tf

    resized = tf.image.resize(pixels, (image.height, image.width), method="bilinear")
    return tf.cast(tf.round(tf.clip_by_value(resized, 0.0, 255.0)), tf.uint8)


def decode_batch(encoded, image: ImageFormat):
    """tf.string [N] -> uint8 [N, height, width, channels]: what the exported signature does first."""
    import tensorflow as tf

    spec = tf.TensorSpec([image.height, image.width, image.channels], tf.uint8)
    return tf.map_fn(lambda one: decode_image(one, image), encoded, fn_output_signature=spec)


def augmentation_layers(names: tuple[str, ...]) -> list:
    """Keras' random preprocessing layers for --augment (training only: the pipeline applies them)."""
    import keras

    layers = {
        "flip": lambda: keras.layers.RandomFlip("horizontal"),
        "rotate": lambda: keras.layers.RandomRotation(0.1),
        "zoom": lambda: keras.layers.RandomZoom(0.1),
        "contrast": lambda: keras.layers.RandomContrast(0.2),
    }
    return [layers[name]() for name in check_augmentations(names)]


def image_file_pipeline(paths, labels, batch: int, seed: int, training: bool, images: ImagePipeline, structure):
    """tf.data over image files: read and decode in parallel (the shared function), optionally cache the
    decoded pixels, shuffle, augment (training only), batch, prefetch. Files are shuffled before decoding when
    nothing is cached, so memory holds a few batches whatever the folder's size."""
    import tensorflow as tf

    autotune = tf.data.AUTOTUNE
    ds = tf.data.Dataset.from_tensor_slices((paths, labels))
    if training and not images.cache:
        ds = ds.shuffle(len(labels), seed=seed, reshuffle_each_iteration=True)  # file names: small
    ds = ds.map(lambda path, y: (decode_image(tf.io.read_file(path), images.image), y), num_parallel_calls=autotune)
    if images.cache:
        ds = ds.cache("" if images.cache == "memory" else images.cache)
        if training:
            ds = ds.shuffle(min(len(labels), 10_000), seed=seed, reshuffle_each_iteration=True)
    ds = ds.batch(batch, drop_remainder=training and len(labels) >= batch)
    if training and images.augment:
        augment = _augmenter(images.augment, seed)
        ds = ds.map(lambda x, y: (augment(x), y), num_parallel_calls=autotune)
    ds = ds.map(lambda x, y: (structure({"images": x}), y))
    return ds.prefetch(autotune)


def _augmenter(names: tuple[str, ...], seed: int) -> Any:
    """uint8 batch -> augmented uint8 batch (Keras' random layers compute in float)."""
    import keras
    import tensorflow as tf

    layers = augmentation_layers(names)
    keras.utils.set_random_seed(seed)

    def apply(x):
        y = tf.cast(x, tf.float32)
        for layer in layers:
            y = layer(y, training=True)
        return tf.cast(tf.round(tf.clip_by_value(y, 0.0, 255.0)), tf.uint8)

    return apply


def serving_examples(dataset, count: int) -> dict:
    """The first `count` held-out examples as a client sends them: image files as their bytes."""
    from trainserve.sources.image_folder import read_files

    if dataset.image is None:
        return {k: v[:count] for k, v in dataset.test.items()}
    return {name: read_files(paths[:count]) for name, paths in dataset.test.items()}


def model_inputs(examples: dict, image: ImageFormat | None) -> dict:
    """What the model itself takes for `examples` (image bytes decoded by the shared function)."""
    if image is None:
        return examples
    import tensorflow as tf

    from trainserve.data import IMAGES

    (encoded,) = examples.values()
    return {IMAGES: decode_batch(tf.constant(list(encoded), tf.string), image).numpy()}
