"""Folders of image files as people have them, rendered at test time with Pillow: every format and mode
trainserve must decode (JPEG RGB and CMYK, PNG RGB / RGBA / gray / 16-bit / palette, BMP, animated GIF), of
different sizes, in three classes with non-ASCII names. The task is learnable from shape alone (horizontal
stripes, vertical stripes, a centred square; light on dark in random colours), so grayscale files, colour
files and any resize keep it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

CLASSES = ("rayures_é", "вертикаль", "正方形")  # sorted: the order trainserve and Keras give them
FORMATS = ("jpeg-rgb", "jpeg-cmyk", "png-rgb", "png-rgba", "png-gray", "png-16bit", "png-palette", "bmp", "gif")
SIZES = ((40, 40), (48, 32), (30, 44), (64, 64))


def pattern(label: int, height: int, width: int, rng: np.random.Generator) -> np.ndarray:
    """uint8 RGB [H, W, 3]: class 0 horizontal stripes, 1 vertical stripes, 2 a centred square."""
    light, dark = rng.integers(180, 256, 3), rng.integers(0, 60, 3)
    rows, cols = np.mgrid[0:height, 0:width]
    if label == 0:
        mask = (rows * 4 // height) % 2 == 0
    elif label == 1:
        mask = (cols * 4 // width) % 2 == 0
    else:
        mask = (abs(rows - height / 2) < height / 4) & (abs(cols - width / 2) < width / 4)
    return np.where(mask[..., None], light, dark).astype(np.uint8)


def save_image(pixels: np.ndarray, path: Path, kind: str) -> Path:
    """`pixels` (RGB) written as `kind`; returns the path (its suffix chosen by the format)."""
    from PIL import Image

    image = Image.fromarray(pixels, "RGB")
    if kind.startswith("jpeg"):
        path = path.with_suffix(".JPG" if kind == "jpeg-cmyk" else ".jpg")
        (image.convert("CMYK") if kind == "jpeg-cmyk" else image).save(path, "JPEG", quality=95)
    elif kind == "png-rgba":
        image.putalpha(200)
        image.save(path := path.with_suffix(".png"))
    elif kind == "png-gray":
        image.convert("L").save(path := path.with_suffix(".png"))
    elif kind == "png-16bit":
        gray = np.asarray(image.convert("L"), np.uint16) * 257
        Image.fromarray(gray.astype(np.uint16)).save(path := path.with_suffix(".png"))
    elif kind == "png-palette":
        image.convert("P", palette=Image.Palette.ADAPTIVE, colors=16).save(path := path.with_suffix(".PNG"))
    elif kind == "bmp":
        image.save(path := path.with_suffix(".bmp"))
    elif kind == "gif":  # animated: the first frame is the image, the second its negative
        negative = Image.fromarray(255 - pixels, "RGB")
        image.save(path := path.with_suffix(".gif"), save_all=True, append_images=[negative], duration=100, loop=0)
    else:
        image.save(path := path.with_suffix(".png"))
    return path


def write_image_folder(root: Path, per_class: int = 30, seed: int = 0) -> Path:
    """`root/<class>/<file>` for the three classes, formats and sizes cycling; returns root."""
    rng = np.random.default_rng(seed)
    for label, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            height, width = SIZES[(i + label) % len(SIZES)]
            kind = FORMATS[(i + 2 * label) % len(FORMATS)]
            save_image(pattern(label, height, width, rng), root / name / f"img{i:03d}", kind)
    return root
