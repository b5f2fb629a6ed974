"""Write a servable SavedModel with the serving signature (warmup and metadata: `trainserve.layout`).

Signature `serving_default`: input `images` (uint8 `[None, H, W, C]`, preprocessing inside the graph),
outputs `probabilities` (float32 `[None, K]`) and `classes` (int64 `[None]`).
"""

from __future__ import annotations

from pathlib import Path

from trainserve.layout import DEFAULT_SIGNATURE
from trainserve.training.pipeline import preprocess


def export_savedmodel(model, path: Path, input_shape: tuple[int, int, int]) -> None:
    """Export `model` (float32) with the serving signature; no device scope, so no node is pinned."""
    import keras
    import tensorflow as tf

    archive = keras.export.ExportArchive()
    archive.track(model)

    def serve(images):
        probabilities = model(preprocess(images), training=False)
        return {
            "probabilities": tf.cast(probabilities, tf.float32),
            "classes": tf.argmax(probabilities, axis=-1, output_type=tf.int64),
        }

    archive.add_endpoint(
        name=DEFAULT_SIGNATURE,
        fn=serve,
        input_signature=[tf.TensorSpec([None, *input_shape], tf.uint8, name="images")],
    )
    archive.write_out(str(path), verbose=False)
