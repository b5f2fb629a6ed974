"""The models replay's tests serve: softmax(3x) over 4 classes, and variants of it that a candidate can be."""

from __future__ import annotations

import numpy as np


def save_scorer(path, moves_class_2: bool = False, refuses_above: float | None = None):
    """probabilities = softmax(3x) over 4 classes; `moves_class_2`: where that top class is 2, its probability
    goes to class 3 (so exactly those examples flip, 2 -> 3); `refuses_above`: a request with any x[:, 0] above it
    fails in the graph (INVALID_ARGUMENT), as a candidate with a broken input check would."""
    import tensorflow as tf

    class Scorer(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
        def serve(self, x):
            if refuses_above is not None:
                tf.debugging.assert_less_equal(x[:, 0], refuses_above, message="x[:, 0] out of range")
            p = tf.nn.softmax(3.0 * x)
            if moves_class_2:
                moved = tf.stack([p[:, 0], p[:, 1], tf.zeros_like(p[:, 2]), p[:, 2] + p[:, 3]], axis=1)
                p = tf.where(tf.equal(tf.argmax(p, axis=1), 2)[:, None], moved, p)
            return {"probabilities": p, "classes": tf.argmax(p, axis=1)}

    module = Scorer()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return path


def traffic(seed: int = 3, requests: int = 240) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(size=(int(rng.integers(1, 5)), 4)).astype(np.float32)} for _ in range(requests)]
