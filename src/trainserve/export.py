"""Write a servable SavedModel: the serving signature, warmup requests and trainserve metadata.

Signature `serving_default`: input `images` (uint8 `[None, H, W, C]`, preprocessing inside the graph),
outputs `probabilities` (float32 `[None, K]`) and `classes` (int64 `[None]`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from trainserve.data import preprocess
from trainserve.savedmodel import DEFAULT_SIGNATURE

WARMUP_FILE = "tf_serving_warmup_requests"
METADATA_FILE = "trainserve.json"
MAX_WARMUP_RECORDS = 1000  # TF Serving reads at most this many


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


def write_warmup_requests(version_dir: Path, model_name: str, images: np.ndarray, batch_sizes=(1, 8, 32)) -> int:
    """`assets.extra/tf_serving_warmup_requests`: real held-out examples as PredictionLog records.

    One record per batch size the server is likely to see, so the first real requests after a load
    are not the slow ones (tensorflow/serving#385).
    """
    import tensorflow as tf
    from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

    extra = version_dir / "assets.extra"
    extra.mkdir(parents=True, exist_ok=True)
    count = 0
    with tf.io.TFRecordWriter(str(extra / WARMUP_FILE)) as writer:
        for size in batch_sizes[:MAX_WARMUP_RECORDS]:
            batch = images[: min(size, len(images))]
            request = predict_pb2.PredictRequest(
                model_spec=model_pb2.ModelSpec(name=model_name, signature_name=DEFAULT_SIGNATURE)
            )
            request.inputs["images"].CopyFrom(tf.make_tensor_proto(batch))
            log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())
            count += 1
    return count


def read_warmup_inputs(version_dir: Path) -> list[tuple[str, dict[str, np.ndarray]]]:
    """The (signature, inputs) of each warmup PredictionLog record, as TF Serving replays them."""
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    path = version_dir / "assets.extra" / WARMUP_FILE
    if not path.is_file():
        return []
    requests = []
    for raw in tf.data.TFRecordDataset(str(path)).take(MAX_WARMUP_RECORDS):
        log = prediction_log_pb2.PredictionLog.FromString(raw.numpy())
        request = log.predict_log.request
        inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
        requests.append((request.model_spec.signature_name or DEFAULT_SIGNATURE, inputs))
    return requests


def write_metadata(version_dir: Path, metadata: dict) -> None:
    extra = version_dir / "assets.extra"
    extra.mkdir(parents=True, exist_ok=True)
    (extra / METADATA_FILE).write_text(json.dumps(metadata, indent=2, sort_keys=True) + "\n")
