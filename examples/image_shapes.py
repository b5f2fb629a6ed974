"""Your own images, no download: renders a folder of image files per class (stripes across, stripes down, a
square; JPEG, PNG and GIF files of different sizes, light on dark in random colours) for `trainserve train
--data DIR/`. No model function: the default architecture follows the data (a CNN for images).

    python examples/image_shapes.py DIR [PER_CLASS]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from PIL import Image

CLASSES = ("across", "down", "square")
SIZES = ((48, 48), (64, 40), (40, 56))


def render(label: int, height: int, width: int, rng: np.random.Generator) -> np.ndarray:
    light, dark = rng.integers(180, 256, 3), rng.integers(0, 60, 3)
    rows, cols = np.mgrid[0:height, 0:width]
    masks = (
        (rows * 4 // height) % 2 == 0,
        (cols * 4 // width) % 2 == 0,
        (abs(rows - height / 2) < height / 4) & (abs(cols - width / 2) < width / 4),
    )
    return np.where(masks[label][..., None], light, dark).astype(np.uint8)


def write_folder(root: str, per_class: int = 60) -> None:
    rng = np.random.default_rng(0)
    for label, name in enumerate(CLASSES):
        (Path(root) / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            image = Image.fromarray(render(label, *SIZES[i % len(SIZES)], rng))
            image.save(Path(root) / name / f"{i:03d}.{('jpg', 'png', 'gif')[i % 3]}")


if __name__ == "__main__":
    write_folder(sys.argv[1], *(int(a) for a in sys.argv[2:3]))
