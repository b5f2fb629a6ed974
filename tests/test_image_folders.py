"""A folder of image files per class, as people keep them: trained with no --architecture, served taking the
files' bytes, evaluated from a folder; the same pixels in training and serving; augmentation training-only.

One model is trained per module (16x16 images, a few epochs, every augmentation on) and served in process.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
from pathlib import Path

import grpc
import numpy as np
import pytest
from image_files import CLASSES, write_image_folder

from conftest import assert_one_line_error, run_cli, target_flags
from trainserve.errors import TrainserveError
from trainserve.hashed_split import HashedSplit, default_salt, file_digests

MODEL = "pics"
IMAGE_SIZE = "16,16"


pytestmark = pytest.mark.xdist_group("image-folders")  # one worker: the module's fixtures train once (conftest.py)


def folder_flags(photos: Path) -> tuple:
    return ("--data", f"{photos}/", "--image-size", IMAGE_SIZE)


def output_flags(root: Path) -> tuple:
    return ("--export-base", root / "models", "--data-dir", root / "data", "--logs-dir", root / "logs")


@pytest.fixture(scope="module")
def image_model(tmp_path_factory):
    """The folder (with a notes.txt and a truncated JPEG), trained with --skip-bad-images and every augmentation."""
    root = tmp_path_factory.mktemp("images")
    photos = write_image_folder(root / "photos", per_class=30)
    (photos / CLASSES[0] / "notes.txt").write_text("not an image")
    truncated = photos / CLASSES[1] / "truncated.jpg"
    truncated.write_bytes(next((photos / CLASSES[1]).glob("*.jpg")).read_bytes()[:300])
    fit = ("--epochs", "8", "--batch-size", "16", "--augment", "flip,rotate,zoom,contrast", "--skip-bad-images")
    proc = run_cli("train", *folder_flags(photos), *fit, "--model-name", MODEL, *output_flags(root), cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {
        "root": root,
        "photos": photos,
        "truncated": truncated,
        "log": proc.stderr,
        "version": root / "models" / MODEL / "1",
        "test_dir": root / "data" / MODEL / "test",
    }


@pytest.fixture(scope="module")
def image_server(image_model):
    from serving_fixtures import InProcessServer

    server = InProcessServer(f"--model_name={MODEL}", f"--model_base_path={image_model['root'] / 'models' / MODEL}")
    server.wait_available(MODEL, 1)
    yield server
    assert server.stop() == 0


@pytest.mark.integration
def test_folder_trains_with_the_cnn_chosen_for_images_skipping_what_is_no_image(image_model):
    log = image_model["log"]
    assert "architecture cnn, chosen for the data" in log
    assert "1 file(s) without an image extension skipped" in log
    summary = json.loads((image_model["root"] / "logs" / "run_summary.json").read_text())
    assert summary["data"]["skipped"] == {"other_files": 1, "bad_images": [str(image_model["truncated"])]}
    metadata = json.loads((image_model["version"] / "assets.extra" / "trainserve.json").read_text())
    assert metadata["image"] == {"height": 16, "width": 16, "channels": 3}
    assert metadata["label_names"] == list(CLASSES)
    # The held-out split is kept as files, by class folder, for the eval client: the images whose bytes the
    # model's salt places there (trainserve.hashed_split), each once.
    held_out = sorted(p.parent.name for p in image_model["test_dir"].rglob("*") if p.is_file())
    images = [p for p in image_model["photos"].rglob("*.*") if p.suffix != ".txt" and p != image_model["truncated"]]
    expected = HashedSplit(default_salt(MODEL), 0.2).held_out(file_digests(images))
    assert set(held_out) == set(CLASSES) and len(held_out) == expected.sum() > 9


@pytest.mark.integration
def test_a_truncated_jpeg_stops_training_with_one_line_naming_it(image_model, tmp_path):
    photos = shutil.copytree(image_model["photos"], tmp_path / "photos")
    proc = run_cli("train", *folder_flags(photos), *output_flags(tmp_path), cwd=tmp_path)
    assert_one_line_error(
        proc, str(photos / CLASSES[1] / "truncated.jpg"), "not a decodable image", "--skip-bad-images"
    )


@pytest.mark.integration
def test_eval_on_the_held_out_folder_and_a_third_party_client_agree(image_model, image_server, tmp_path):
    """eval sends the files' bytes and reports per class by name; a plain TF Serving client (the serving
    wheel's protos, grpc) sending the same bytes gets exactly the same accuracy."""
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    report = tmp_path / "report.json"
    proc = run_cli(
        "eval",
        *target_flags(image_server, MODEL),
        *("--data", f"{image_model['test_dir']}/", "--report", report, "--batch-size", "5"),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    accuracy = json.loads(report.read_text())["metrics"]["accuracy"]
    assert accuracy >= 0.9
    assert all(name in proc.stdout for name in CLASSES[1:])  # per-class rows, by name

    stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(image_server.target))
    files = sorted(p for p in image_model["test_dir"].rglob("*") if p.is_file())
    correct = 0
    for start in range(0, len(files), 4):
        batch = files[start : start + 4]
        request = predict_pb2.PredictRequest()
        request.model_spec.name = MODEL
        request.inputs["image_bytes"].CopyFrom(tf.make_tensor_proto([p.read_bytes() for p in batch]))
        answer = stub.Predict(request, timeout=30)
        names = [n.decode() for n in tf.make_ndarray(answer.outputs["class_names"])]
        correct += sum(name == p.parent.name for name, p in zip(names, batch))
    assert correct / len(files) == pytest.approx(accuracy, abs=1e-12)


@pytest.mark.integration
def test_the_held_out_files_are_the_versions_own_split(image_model, image_server, tmp_path):
    """The folder split is kept content-addressed (a later training cannot replace it) and recorded for the
    version; `eval --data held-out` judges the version on exactly those files, and knows them for its own."""
    from trainserve.image_splits import fingerprint_folder

    data_dir = image_model["root"] / "data"
    record = json.loads((data_dir / MODEL / "versions" / "1.json").read_text())["test_split"]
    kept = data_dir / MODEL / record["file"]
    assert kept.is_dir() and fingerprint_folder(kept) == record["fingerprint"] == fingerprint_folder(
        image_model["test_dir"]
    )
    report = tmp_path / "held_out.json"
    proc = run_cli(
        "eval",
        *target_flags(image_server, MODEL),
        *("--data", "held-out", "--data-dir", data_dir, "--report", report),
        "--min-accuracy",
        "0.9",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    written = json.loads(report.read_text())
    assert written["data_check"]["matches"] is True and written["data"]["examples"] == record["examples"]


@pytest.mark.integration
def test_eval_refuses_a_class_folder_the_model_does_not_know(image_model, image_server, tmp_path):
    (tmp_path / "unknown" / "zebra").mkdir(parents=True)
    shutil.copy(next(image_model["test_dir"].rglob("*.png")), tmp_path / "unknown" / "zebra" / "a.png")
    proc = run_cli("eval", "--server", image_server.target, "--model", MODEL, "--data", f"{tmp_path / 'unknown'}/")
    assert_one_line_error(proc, "zebra", "not classes of", CLASSES[0])


@pytest.mark.integration
def test_training_pipeline_and_served_signature_see_the_same_pixels(image_model):
    """Every held-out file through the training pipeline (decoded, resized: no augmentation at test time) and
    its bytes through serving_default: the pixels signature fed the pipeline's pixels answers bit for bit the
    same, and the pixels equal those the export's own decode gives."""
    import tensorflow as tf

    from trainserve.data import ImageFormat
    from trainserve.training.images import ImagePipeline, decode_batch, image_file_pipeline

    files = sorted(str(p) for p in image_model["test_dir"].rglob("*") if p.is_file())
    image = ImageFormat(16, 16, 3)
    ds = image_file_pipeline(
        np.array(files), np.zeros(len(files), np.int64), 64, 0, False, ImagePipeline(image), lambda inputs: inputs
    )
    pixels = np.concatenate([batch["images"].numpy() for batch, _ in ds])
    encoded = tf.constant([Path(f).read_bytes() for f in files])
    np.testing.assert_array_equal(pixels, decode_batch(encoded, image).numpy())

    loaded = tf.saved_model.load(str(image_model["version"]))
    by_bytes = loaded.signatures["serving_default"](image_bytes=encoded)
    by_pixels = loaded.signatures["serving_pixels"](images=tf.constant(pixels))
    np.testing.assert_array_equal(by_bytes["probabilities"].numpy(), by_pixels["probabilities"].numpy())


@pytest.mark.integration
def test_augmentation_is_absent_from_the_served_graph(image_model):
    """Trained with flip, rotate, zoom and contrast: no random op reaches the SavedModel, and the same bytes
    always get the same answer."""
    import tensorflow as tf
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel.FromString((image_model["version"] / "saved_model.pb").read_bytes())
    ops = set()
    for meta in saved.meta_graphs:
        ops |= {node.op for node in meta.graph_def.node}
        ops |= {node.op for fn in meta.graph_def.library.function for node in fn.node_def}
    random = sorted(op for op in ops if "Random" in op or op.startswith("ImageProjectiveTransform"))
    assert not random, random
    assert "DecodeImage" in ops  # the decode is in the graph, the augmentation is not
    loaded = tf.saved_model.load(str(image_model["version"]))
    encoded = tf.constant([p.read_bytes() for p in sorted(image_model["test_dir"].rglob("*.png"))])
    first, second = (loaded.signatures["serving_default"](image_bytes=encoded)["probabilities"] for _ in range(2))
    np.testing.assert_array_equal(first.numpy(), second.numpy())


@pytest.mark.integration
def test_rest_predict_with_b64_image_bytes(image_model, image_server):
    """curl-style REST, as TF Serving takes binary DT_STRING values: {"b64": ...}."""
    path = next(image_model["test_dir"].rglob("*.jpg"))
    body = {"instances": [{"image_bytes": {"b64": base64.b64encode(path.read_bytes()).decode()}}]}
    status, answer = image_server.post(f"/v1/models/{MODEL}:predict", body)
    assert status == 200, answer
    assert answer["predictions"][0]["class_names"] == path.parent.name


@pytest.mark.unit
@pytest.mark.parametrize(
    "layout, fragment",
    [
        pytest.param({"only": ["a.png"]}, "1 class folder(s)", id="one-class"),
        pytest.param({"a": ["x.png"], "b": ["notes.txt"]}, "class folder 'b' holds no image", id="empty-class"),
        pytest.param({}, "0 class folder(s)", id="no-images"),
    ],
)
def test_folders_that_cannot_train_are_one_line_errors(tmp_path, layout, fragment):
    from trainserve.sources.image_folder import scan_image_folder

    for folder, names in layout.items():
        (tmp_path / folder).mkdir()
        for name in names:
            (tmp_path / folder / name).write_bytes(b"x")
    with pytest.raises(TrainserveError, match=re.escape(fragment)) as err:
        scan_image_folder(tmp_path)
    assert "\n" not in str(err.value)


@pytest.mark.unit
def test_class_names_follow_keras_rules(tmp_path):
    """Sorted sub-folder names (dot-folders skipped), extensions in any case, other files counted."""
    from trainserve.sources.image_folder import list_images

    for path in ["b/1.JPEG", "b/sub/2.Png", "a/3.gif", "a/readme.md", ".hidden/4.png", "loose.txt"]:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(b"x")
    files, names, other = list_images(tmp_path)
    assert names == ["a", "b"]
    assert [(p.relative_to(tmp_path).as_posix(), label) for p, label in files] == [
        ("a/3.gif", 0),
        ("b/1.JPEG", 1),
        ("b/sub/2.Png", 1),
    ]
    assert other == 2


@pytest.mark.unit
def test_both_image_signatures_share_one_traced_network(tmp_path):
    """The export traces the network once for `serving_default` and `serving_pixels` together (Keras lists the
    endpoints' variables, and the save traces its signatures: 3 traces; once per signature: 5), and both answer."""
    import keras
    import tensorflow as tf

    from trainserve.data import ImageFormat
    from trainserve.task import Task
    from trainserve.training.export import export_savedmodel
    from trainserve.training.model_fn import data_spec

    traced = []

    class Counting(keras.layers.Layer):
        def call(self, x):
            traced.append(1)  # Python runs a layer's call once per trace
            return x

    inputs = keras.Input((8, 8, 3), name="images")  # the name the image signatures feed
    model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(keras.layers.Flatten()(Counting()(inputs))))
    task = Task("classification", classes=3, label_names=("a", "b", "c"))
    spec = data_spec({}, task, image=ImageFormat(8, 8, 3))
    traced.clear()
    export_savedmodel(model, tmp_path / "1", spec.inputs, task, image=spec.image)
    assert len(traced) <= 3, f"the network traced {len(traced)} times"
    pixels = tf.zeros([2, 12, 12, 3], tf.uint8)
    answered = tf.saved_model.load(str(tmp_path / "1")).signatures["serving_pixels"](images=pixels)
    assert answered["probabilities"].shape == (2, 3)
