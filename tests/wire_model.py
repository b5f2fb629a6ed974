"""What the wire tests share: small SavedModels (made with TensorFlow, not trainserve), serve-local serving them
in this process, and TensorProtos broken on purpose."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from serving_fixtures import InProcessServer
from trainserve.tensors import to_tensor_proto


def save_wire_model(path: Path) -> Path:
    """Inputs x float32 [None, 3], n int64 [None], s string [None]. `total` joins x and n, so their batch sizes
    must agree (or broadcast); `raw_bytes` ends in _bytes, which REST always writes as base64."""
    import tensorflow as tf

    class Wire(tf.Module):
        @tf.function(
            input_signature=[
                tf.TensorSpec([None, 3], tf.float32),
                tf.TensorSpec([None], tf.int64),
                tf.TensorSpec([None], tf.string),
            ]
        )
        def serve(self, x, n, s):
            total = tf.reduce_sum(x, axis=1) + tf.cast(n, tf.float32)
            count = n + tf.cast(tf.strings.length(s), tf.int64)
            return {"y": x * 2.0, "total": total, "count": count, "echo": s, "raw_bytes": tf.identity(s)}

    module = Wire()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return path


def save_csv_model(path: Path) -> Path:
    """Like a CSV model: one float32 per column and a text column; NaN reads as "missing" (score 0 for it),
    so an instance that lacks a column would silently get another answer."""
    import tensorflow as tf

    class Csv(tf.Module):
        @tf.function(
            input_signature=[
                tf.TensorSpec([None], tf.float32),
                tf.TensorSpec([None], tf.float32),
                tf.TensorSpec([None], tf.string),
            ]
        )
        def serve(self, a, b, kind):
            known = tf.where(tf.math.is_nan(b), tf.zeros_like(b), b)
            return {"score": a + 2.0 * known + tf.cast(tf.equal(kind, "p"), tf.float32)}

    module = Csv()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return path


def save_failing_model(path: Path) -> Path:
    """Loads, and fails when run: `serving_default` on a zero (1/0 is not finite: INVALID_ARGUMENT), `read`
    on a path that is missing (NOT_FOUND) or a directory (FAILED_PRECONDITION): TensorFlow's own codes."""
    import tensorflow as tf

    class Failing(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def inverse(self, x):
            return {"inverse": tf.debugging.check_numerics(1.0 / x, "inverse of x")}

        @tf.function(input_signature=[tf.TensorSpec([], tf.string)])
        def read(self, path):
            return {"size": tf.strings.length(tf.io.read_file(path))}

    module = Failing()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.inverse, "read": module.read})
    return path


def serve_models(root: Path, **versions: Path) -> InProcessServer:
    """serve-local on a ModelServerConfig naming each model's base path (the parent of its version 1)."""
    configs = "".join(
        f'config {{ name: "{name}" base_path: "{version.parent}" model_platform: "tensorflow" }} '
        for name, version in versions.items()
    )
    config = root / "models.config"
    config.write_text(f"model_config_list {{ {configs}}}\n")
    server = InProcessServer(f"--model_config_file={config}")
    for name in versions:
        server.wait_available(name, 1)
    return server


def broken(array: np.ndarray, dims=None, as_values: bool = False, **fields):
    """`array` as a TensorProto with its shape replaced by `dims` and `fields` set (lists extend)."""
    proto = to_tensor_proto(array, as_values=as_values)
    if dims is not None:
        del proto.tensor_shape.dim[:]
        for size in dims:
            proto.tensor_shape.dim.add(size=size)
    for field, value in fields.items():
        if isinstance(value, list):
            getattr(proto, field).extend(value)
        else:
            setattr(proto, field, value)
    return proto
