"""`--data synthetic`: learnable class templates plus noise, generated (no file), for load and speed runs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainserve.options import image_shape, option, positive_int


@dataclass(frozen=True)
class SyntheticSpec:
    """Shape of `--data synthetic`: learnable class templates plus noise, for load and speed runs."""

    shape: tuple[int, int, int] = option((28, 28, 1), "H,W,C of --data synthetic", parse=image_shape)
    classes: int = option(10, "classes of --data synthetic", parse=positive_int)
    size: int = option(10000, "examples of --data synthetic", parse=positive_int)


def synthetic_examples(spec: SyntheticSpec, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`count` images drawn around fixed per-class templates: learnable, deterministic per seed.

    Integer noise keeps generation cheap enough for load runs (a client must not be slower than a server).
    """
    templates = np.random.default_rng(1234).integers(0, 256, (spec.classes, *spec.shape), dtype=np.int16)
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, spec.classes, count)
    noise = rng.integers(-80, 81, (count, *spec.shape), dtype=np.int16)
    images = np.clip(templates[labels] + noise, 0, 255).astype(np.uint8)
    return images, labels.astype(np.int64)
