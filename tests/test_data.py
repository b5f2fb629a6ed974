"""Data loading and validation: every source ends as uint8 NHWC with labels in [0, K)."""

from __future__ import annotations

import numpy as np
import pytest

from trainserve.data import SyntheticSpec, load_dataset, write_test_split
from trainserve.errors import TrainserveError
from trainserve.training.pipeline import make_input_pipeline


def _npz(path, **overrides):
    rng = np.random.default_rng(0)
    arrays = {
        "x_train": rng.integers(0, 256, (20, 6, 5), dtype=np.uint8),
        "y_train": np.arange(20) % 3,
        "x_test": rng.integers(0, 256, (6, 6, 5), dtype=np.uint8),
        "y_test": np.arange(6) % 3,
    }
    arrays.update(overrides)
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
    return path


def test_digits_is_uint8_nhwc_with_ten_classes():
    ds = load_dataset("digits")
    assert ds.x_train.dtype == np.uint8 and ds.input_shape == (8, 8, 1)
    assert ds.num_classes == 10 and ds.x_train.max() == 255
    assert len(ds.x_train) + len(ds.x_test) == 1797
    assert ds.fingerprint() == load_dataset("digits").fingerprint()


def test_synthetic_follows_its_flags_and_seed():
    spec = SyntheticSpec(shape=(4, 6, 3), classes=5, size=100)
    ds = load_dataset("synthetic", spec, seed=3)
    assert ds.input_shape == (4, 6, 3) and ds.num_classes == 5 and len(ds.x_train) + len(ds.x_test) == 100
    assert ds.fingerprint() == load_dataset("synthetic", spec, seed=3).fingerprint()
    assert ds.fingerprint() != load_dataset("synthetic", spec, seed=4).fingerprint()


def test_npz_hw_images_gain_a_channel_axis(tmp_path):
    ds = load_dataset(str(_npz(tmp_path / "d.npz")))
    assert ds.input_shape == (6, 5, 1) and ds.num_classes == 3 and ds.name == "d"


@pytest.mark.parametrize(
    "overrides, message",
    [
        pytest.param(
            {"y_test": None}, "lacks y_test: expected keys x_train, y_train, x_test, y_test", id="missing-key"
        ),
        pytest.param(
            {"y_test": np.array([0, 1, 2, 3, 0, 1])},
            "label 3 is out of range: expected labels in [0, 3)",
            id="label-too-big",
        ),
        pytest.param({"y_train": -(np.arange(20) % 3)}, "labels must be integers >= 0", id="negative-label"),
        pytest.param({"y_train": np.arange(19) % 3}, "x_train has 20 examples but y_train has 19", id="lengths"),
        pytest.param({"x_test": np.zeros((6, 6, 5), np.float32)}, "dtype float32: expected uint8", id="dtype"),
        pytest.param({"x_test": np.zeros((6, 7, 5), np.uint8)}, "expected one image shape", id="shapes"),
        pytest.param(
            {"y_train": (np.arange(20) % 3).astype(np.float32)}, "expected 1-D integer labels", id="float-labels"
        ),
    ],
)
def test_bad_npz_is_rejected_with_what_was_expected(tmp_path, overrides, message):
    with pytest.raises(TrainserveError) as err:
        load_dataset(str(_npz(tmp_path / "d.npz", **overrides)))
    assert message in str(err.value)


def test_missing_and_corrupt_files(tmp_path):
    with pytest.raises(TrainserveError, match="not found: expected an .npz"):
        load_dataset(str(tmp_path / "nope.npz"))
    (tmp_path / "bad.npz").write_bytes(b"PK\x03\x04 this is no zip")
    with pytest.raises(TrainserveError, match="is not a readable .npz"):
        load_dataset(str(tmp_path / "bad.npz"))
    with pytest.raises(TrainserveError, match="unknown data source 'imagenet'"):
        load_dataset("imagenet")


def test_offline_keras_dataset_is_a_clear_error(tmp_path, monkeypatch):
    # A proxy on a closed local port: exactly what a machine without internet looks like to urllib.
    import urllib.request

    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    monkeypatch.setattr(urllib.request, "_opener", None)  # the opener urlopen builds now is dropped afterwards
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    with pytest.raises(TrainserveError, match="could not download keras data set 'mnist'.*offline"):
        load_dataset("mnist")


def test_test_split_is_shared_exactly(tmp_path):
    ds = load_dataset("digits")
    path = write_test_split(ds, tmp_path, "digits")
    assert path == tmp_path / "digits" / "test.npz"
    with np.load(path) as npz:
        np.testing.assert_array_equal(npz["x_test"], ds.x_test)
        np.testing.assert_array_equal(npz["y_test"], ds.y_test)
        assert list(npz["label_names"]) == ds.label_names
    assert [p.name for p in path.parent.iterdir()] == ["test.npz"], "no temp file left behind"


def test_input_pipeline_preprocesses_and_batches():
    ds = load_dataset("digits")
    batches = list(make_input_pipeline(ds.x_test, ds.y_test, 64, seed=0, training=False))
    images, labels = batches[0]
    assert images.dtype.name == "float32" and images.shape == (64, 8, 8, 1)
    assert float(images.numpy().max()) == 1.0 and float(images.numpy().min()) == 0.0
    assert sum(len(b[1]) for b in batches) == len(ds.y_test)
    np.testing.assert_array_equal(labels.numpy(), ds.y_test[:64])
