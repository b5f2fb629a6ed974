"""Image input: trainserve's folder pipeline vs keras.utils.image_dataset_from_directory, and served bytes.

    python bench/image_input.py [--images 2000] [--size 128] [--image-size 64,64]

Renders a folder of JPEG/PNG files per class, then, each in its own process (so peak RSS is its own):
  ours    trainserve's tf.data pipeline (training/images.py: parallel decode, shuffle, prefetch)
  keras   keras.utils.image_dataset_from_directory with the same image size and batch
feeding the same small CNN for one timed epoch (after a warm-up epoch): images/s and peak RSS of each.
Then trains a model on the folder, serves it (serve-local) and evaluates the folder over gRPC (the files'
bytes, decoded in the server) against the in-process ceiling (the same SavedModel called on the same bytes).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
BATCH = 32


def render_folder(root: Path, count: int, size: int) -> Path:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(count):
        label = i % 3
        pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        pixels[..., label] = 255
        (root / f"class{label}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(root / f"class{label}" / f"{i}.{'jpg' if i % 2 else 'png'}")
    return root


def worker(kind: str, folder: Path, height: int, width: int) -> dict:
    """One pipeline feeding the CNN: images/s over one epoch after a warm-up epoch, and this process's peak RSS."""
    import keras
    import numpy as np

    from trainserve.data import ImageFormat
    from trainserve.sources.image_folder import list_images
    from trainserve.task import Task
    from trainserve.training import model_fn
    from trainserve.training.images import ImagePipeline, image_file_pipeline

    files, names, _ = list_images(folder)
    if kind == "ours":
        paths = np.array([str(p) for p, _ in files])
        labels = np.array([label for _, label in files], np.int64)
        pipeline = ImagePipeline(ImageFormat(height, width, 3))
        ds = image_file_pipeline(paths, labels, BATCH, 0, True, pipeline, lambda inputs: inputs["images"])
    else:
        ds = keras.utils.image_dataset_from_directory(folder, image_size=(height, width), batch_size=BATCH, seed=0)
    spec = model_fn.data_spec({}, Task("classification", classes=len(names)), image=ImageFormat(height, width, 3))
    model = model_fn.build("cnn", spec)
    model.compile("adam", "sparse_categorical_crossentropy")
    model.fit(ds, epochs=1, verbose=0)
    started = time.perf_counter()
    model.fit(ds, epochs=1, verbose=0)
    seconds = time.perf_counter() - started
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"pipeline": kind, "images_per_s": round(len(files) / seconds, 1), "peak_rss_mb": round(peak_mb, 1)}


def served_vs_ceiling(folder: Path, work: Path, image_size: str) -> dict:
    """Train on the folder, serve it, evaluate the folder over gRPC; the ceiling calls the SavedModel in process
    (bench/ceiling.py: the best over batch sizes and 1, 2 and 4 threads, as eval keeps 4 requests in flight)."""
    import numpy as np

    cli = [sys.executable, "-m", "trainserve"]
    subprocess.run(
        [
            *cli,
            "train",
            "--data",
            f"{folder}/",
            "--image-size",
            image_size,
            "--epochs",
            "1",
            "--model-name",
            "pics",
            "--export-base",
            work / "models",
            "--data-dir",
            work / "data",
            "--logs-dir",
            work / "logs",
        ],
        check=True,
        capture_output=True,
    )
    sys.path.insert(0, str(Path(__file__).parent))
    from ceiling import in_process_ceiling
    from loopback import free_port

    port, rest = free_port(), free_port()
    server = subprocess.Popen(
        [
            *cli,
            "serve-local",
            f"--port={port}",
            f"--rest_api_port={rest}",
            "--model_name=pics",
            f"--model_base_path={work / 'models' / 'pics'}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        report = work / "report.json"
        for _ in range(2):  # the first run also waits for the version to load; the second is timed
            subprocess.run(
                [
                    *cli,
                    "eval",
                    "--server",
                    f"127.0.0.1:{port}",
                    "--model",
                    "pics",
                    "--data",
                    f"{folder}/",
                    "--report",
                    report,
                    "--batch-size",
                    str(BATCH),
                    "--wait",
                    "120",
                ],
                capture_output=True,
                check=True,
            )
        served = json.loads(report.read_text())
    finally:
        server.terminate()
        server.wait()
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    encoded = np.array([p.read_bytes() for p in files], dtype=object)
    ceiling = in_process_ceiling(work / "models" / "pics" / "1", encoded, (BATCH, 4 * BATCH), "image_bytes")
    throughput = round(served["performance"]["examples_per_s"], 1)
    return {
        "served_image_bytes_per_s": throughput,
        "in_process_ceiling_per_s": round(ceiling.examples_per_s, 1),
        "in_process_ceiling": ceiling.describe(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--size", type=int, default=128, help="side of the rendered files")
    parser.add_argument("--image-size", default="64,64")
    parser.add_argument("--worker", choices=("ours", "keras"), help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    height, width = (int(d) for d in args.image_size.split(","))
    if args.worker:
        print(json.dumps(worker(args.worker, args.folder, height, width)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = render_folder(Path(tmp) / "photos", args.images, args.size)
        results = {}
        for kind in ("ours", "keras"):
            out = subprocess.run(
                [sys.executable, __file__, "--worker", kind, "--folder", str(folder), "--image-size", args.image_size],
                capture_output=True,
                text=True,
                check=True,
            )
            results[kind] = json.loads(out.stdout.strip().splitlines()[-1])
            print(json.dumps(results[kind]))
        ratio = results["ours"]["images_per_s"] / results["keras"]["images_per_s"]
        print(f"ours / image_dataset_from_directory: {ratio:.2f}x images/s")
        print(json.dumps(served_vs_ceiling(folder, Path(tmp), args.image_size)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
