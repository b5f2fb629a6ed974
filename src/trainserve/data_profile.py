"""Compact statistics of a model's inputs, the same way for the training data and for captured traffic, so the
two can be compared bin by bin (`trainserve drift`).

An input becomes one or more features:
- numbers `[N]` -> one numeric feature; `[N, F]` with F <= 32 -> one per column (`x[3]`); wider -> the per-example
  mean (`x.mean`);
- uint8 images `[N, H, W(, C)]` -> `images.brightness` (per-image mean pixel), `images.channel_c` (per-channel
  mean, colour images), `images.size` (`HxWxC`, a category);
- image files' bytes (JPEG, PNG, GIF, BMP) -> `name.height`, `name.width`, `name.brightness` and `name.channels`;
- other strings `[N]` -> a category, unless nearly every training value differs (free text): then its length.

A numeric feature's bins are the training values' deciles (edges at the 10th..90th percentiles, distinct ones
only), one bin for missing values (NaN) last; training records each bin's count, the quantiles, mean and standard
deviation. A category records each value's count. Traffic is counted into the training's bins, so the counts of
two shards add.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from trainserve.splits import version_record_path

PROFILE_SCHEMA = "trainserve.data-profile/1"
MAX_COLUMNS = 32
QUANTILES = (0, 1, 5, 25, 50, 75, 95, 99, 100)
MAX_CATEGORIES = 10_000
TEXT_UNIQUE_SHARE = 0.5  # a string column with more distinct values than this share of rows is text, not a category


def profile_path(data_dir: Path, model: str, version: int) -> Path:
    """Beside the version's record: `<data_dir>/<model>/versions/<version>.profile.json`."""
    return version_record_path(data_dir, model, version).with_suffix(".profile.json")


def features(inputs: dict[str, np.ndarray], kinds: dict[str, str] | None = None) -> dict[str, tuple[str, np.ndarray]]:
    """name -> (kind "numeric" | "categorical", one value per example). `kinds`: the training profile's
    decision per feature (traffic follows it: a column training called text is measured as text)."""
    out: dict[str, tuple[str, np.ndarray]] = {}
    for name, array in sorted(inputs.items()):
        array = np.asarray(array)
        if array.dtype.kind in "SO" and _is_encoded_image(array):
            out.update(encoded_image_features(name, array.ravel()))
        elif array.dtype.kind in "SUO":
            values = _strings(array.reshape(len(array), -1)[:, 0] if array.ndim > 1 else array)
            as_text = (kinds or {}).get(f"{name}.length") == "numeric" or (kinds is None and _is_text(values))
            out.update(
                {f"{name}.length": ("numeric", np.char.str_len(values).astype(np.float64))}
                if as_text
                else {name: ("categorical", values)}
            )
        elif array.dtype == np.uint8 and array.ndim >= 3:
            out.update(_image_features(name, array))
        elif array.ndim == 1:
            out[name] = ("numeric", array.astype(np.float64))
        else:
            flat = array.reshape(len(array), -1).astype(np.float64)
            if flat.shape[1] <= MAX_COLUMNS:
                out.update({f"{name}[{j}]": ("numeric", flat[:, j]) for j in range(flat.shape[1])})
            else:
                out[f"{name}.mean"] = ("numeric", flat.mean(axis=1))
    return out


def _strings(values: np.ndarray) -> np.ndarray:
    return np.array([v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in values], dtype=str)


def _is_text(values: np.ndarray) -> bool:
    distinct = len(np.unique(values))
    return distinct > 100 and distinct > TEXT_UNIQUE_SHARE * len(values)


def _image_features(name: str, images: np.ndarray) -> dict[str, tuple[str, np.ndarray]]:
    pixels = images.reshape(*images.shape[:3], -1).astype(np.float64)  # [N, H, W, C]
    height, width, channels = pixels.shape[1:]
    out = {f"{name}.brightness": ("numeric", pixels.mean(axis=(1, 2, 3)))}
    if channels > 1:
        means = pixels.mean(axis=(1, 2))
        out.update({f"{name}.channel_{c}": ("numeric", means[:, c]) for c in range(channels)})
    out[f"{name}.size"] = ("categorical", np.full(len(images), f"{height}x{width}x{channels}"))
    return out


IMAGE_MAGIC = (b"\xff\xd8\xff", b"\x89PNG", b"GIF8", b"BM")


def _is_encoded_image(array: np.ndarray) -> bool:
    first = array.ravel()[:1]
    return bool(first.size) and isinstance(first[0], bytes) and first[0].startswith(IMAGE_MAGIC)


def encoded_image_features(name: str, files: np.ndarray) -> dict[str, tuple[str, np.ndarray]]:
    """Image files' bytes (`image_bytes`): each file's height, width, channels (a category) and brightness (the mean
    of its gray levels, 0-255, from a reduced decode), as Pillow reads them; an undecodable file has NaN sizes."""
    import io

    from PIL import Image

    height, width, brightness = (np.full(len(files), np.nan) for _ in range(3))
    channels = np.full(len(files), "undecodable", dtype=object)
    for i, data in enumerate(files):
        try:
            with Image.open(io.BytesIO(data)) as image:
                width[i], height[i] = image.size
                channels[i] = str(len(image.getbands()))
                image.draft("L", (64, 64))  # JPEG: decode at a reduced scale, enough for a mean
                brightness[i] = float(np.asarray(image.convert("L"), np.float64).mean())
        except (OSError, ValueError, Image.DecompressionBombError):
            continue
    return {
        f"{name}.brightness": ("numeric", brightness),
        f"{name}.channels": ("categorical", channels.astype(str)),
        f"{name}.height": ("numeric", height),
        f"{name}.width": ("numeric", width),
    }


def numeric_bins(values: np.ndarray) -> list[float]:
    """The inner edges: the distinct deciles of the finite values."""
    finite = values[np.isfinite(values)]
    if not finite.size:
        return []
    return sorted({float(e) for e in np.percentile(finite, np.arange(10, 100, 10))})


def numeric_counts(values: np.ndarray, edges: list[float]) -> np.ndarray:
    """Counts per bin: (-inf, e1), [e1, e2), ..., [ek, inf), then missing (NaN)."""
    missing = np.isnan(values)
    index = np.searchsorted(np.asarray(edges, np.float64), values[~missing], side="right")
    counts = np.bincount(index, minlength=len(edges) + 1)
    return np.append(counts, int(missing.sum())).astype(np.int64)


def spread(values: np.ndarray) -> dict:
    finite = values[np.isfinite(values)]
    return {
        "count": int(finite.size),
        "sum": float(finite.sum()),
        "sum_squares": float(np.square(finite).sum()),
    }


def profile_inputs(inputs: dict[str, np.ndarray]) -> dict:
    """The training side: each feature's kind, bins and counts (and numeric quantiles)."""
    profile = {}
    for name, (kind, values) in features(inputs).items():
        if kind == "numeric":
            edges = numeric_bins(values)
            finite = values[np.isfinite(values)]
            quantiles = np.percentile(finite, QUANTILES).tolist() if finite.size else []
            profile[name] = {
                "kind": kind,
                "edges": edges,
                "counts": numeric_counts(values, edges).tolist(),
                "quantiles": dict(zip(map(str, QUANTILES), quantiles)),
                **spread(values),
            }
        else:
            unique, counts = np.unique(values, return_counts=True)
            order = np.argsort(-counts, kind="stable")[:MAX_CATEGORIES]
            profile[name] = {
                "kind": kind,
                "categories": {str(unique[i]): int(counts[i]) for i in order},
                "count": int(len(values)),
            }
    return {"schema": PROFILE_SCHEMA, "features": profile}


def count_traffic(profile: dict, inputs: dict[str, np.ndarray]) -> dict:
    """The traffic side, counted into the training profile's bins: {feature: counts} (mergeable by adding)."""
    kinds = {name: f["kind"] for name, f in profile["features"].items()}
    counted = {}
    for name, (kind, values) in features(inputs, kinds).items():
        trained = profile["features"].get(name)
        if trained is None or trained["kind"] != kind:
            continue  # an input training did not have: the caller reports the inputs it cannot compare
        if kind == "numeric":
            counted[name] = {"counts": numeric_counts(values, trained["edges"]).tolist(), **spread(values)}
        else:
            unique, counts = np.unique(values, return_counts=True)
            counted[name] = {"categories": {str(u): int(c) for u, c in zip(unique, counts)}, "count": int(len(values))}
    return counted


def add_counts(total: dict, more: dict) -> dict:
    """Two traffic counts of one profile added (shards, or batches of one capture), into `total`."""
    for name, theirs in more.items():
        mine = total.get(name)
        if mine is None:
            total[name] = {k: dict(v) if isinstance(v, dict) else v for k, v in theirs.items()}
            continue
        for key, value in theirs.items():
            if key == "categories":
                for category, n in value.items():
                    mine[key][category] = mine[key].get(category, 0) + n
            elif key == "counts":
                mine[key] = (np.asarray(mine[key], np.int64) + value).tolist()
            else:
                mine[key] += value
    return total


def mean_sd(state: dict) -> tuple[float, float]:
    n = state["count"]
    if not n:
        return math.nan, math.nan
    mean = state["sum"] / n
    return mean, math.sqrt(max(0.0, state["sum_squares"] / n - mean * mean))
