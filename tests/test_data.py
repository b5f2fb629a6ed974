"""Data loading and validation: every source ends as named inputs with labels in [0, K) or float targets; a
CSV as people have it (text categories, empty cells, class names); any valid npz layout."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import share_split
from trainserve.errors import TrainserveError
from trainserve.sources import SyntheticSpec, load_dataset
from trainserve.splits import fingerprint_npz
from trainserve.training.pipeline import make_input_pipeline

pytestmark = pytest.mark.unit


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
    path = share_split(ds, tmp_path, "digits")
    assert path == tmp_path / "digits" / "test.npz"
    with np.load(path) as npz:
        np.testing.assert_array_equal(npz["x_test"], ds.x_test)
        np.testing.assert_array_equal(npz["y_test"], ds.y_test)
        assert list(npz["label_names"]) == ds.label_names
    kept = sorted(p.relative_to(path.parent).as_posix() for p in path.parent.rglob("*") if p.is_file())
    assert kept == ["splits/" + fingerprint_npz(path) + ".npz", "test.npz"], "no temp file left behind"


def test_input_pipeline_batches_the_stored_data_and_the_model_scales_it():
    """Scaling moved into the built-in models' first layer (so the served graph does what training did)."""
    from conftest import digits_cnn

    ds = load_dataset("digits")
    batches = list(make_input_pipeline(ds.x_test, ds.y_test, 64, seed=0, training=False))
    images, labels = batches[0]
    assert images.dtype.name == "uint8" and images.shape == (64, 8, 8, 1)
    assert sum(len(b[1]) for b in batches) == len(ds.y_test)
    np.testing.assert_array_equal(labels.numpy(), ds.y_test[:64])
    scale = digits_cnn().get_layer("scale")
    scaled = np.asarray(scale(images))
    np.testing.assert_allclose(scaled, images.numpy().astype(np.float32) / 255.0, atol=1e-7)
    assert scaled.max() == 1.0 and scaled.min() == 0.0


def _regression_npz(path, **overrides):
    rng = np.random.default_rng(0)
    arrays = {
        "x_train/age": rng.integers(18, 90, (20, 1)),
        "x_train/scores": rng.random((20, 3)).astype(np.float32),
        "y_train": rng.random(20).astype(np.float32),
        "x_test/age": rng.integers(18, 90, (5, 1)),
        "x_test/scores": rng.random((5, 3)).astype(np.float32),
        "y_test": rng.random(5).astype(np.float32),
    }
    arrays.update(overrides)
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
    return path


def test_named_inputs_and_float_labels_make_a_regression(tmp_path):
    from trainserve.layout import split_input_names, split_task

    ds = load_dataset(str(_regression_npz(tmp_path / "r.npz")))
    assert sorted(ds.train) == ["age", "scores"] and not ds.single
    assert ds.task.kind == "regression" and ds.task.targets == 1 and ds.y_train.shape == (20, 1)
    path = share_split(ds, tmp_path, "r")
    with np.load(path) as npz:
        assert split_input_names(npz.files) == ["age", "scores"] and "x_test" not in npz.files
        assert split_task(npz) == ds.task
        np.testing.assert_array_equal(npz["x_test/age"], ds.test["age"])


@pytest.mark.parametrize(
    "overrides, message",
    [
        pytest.param(
            {"y_train": np.array(["a"] * 20)}, "expected 1-D integer labels (classification) or float", id="str"
        ),
        pytest.param({"y_test": np.arange(5)}, "of the same kind as y_test", id="mixed-kinds"),
        pytest.param({"x_test/age": np.zeros((5, 2), np.int64)}, "expected one example shape", id="shape"),
        pytest.param(
            {"x_test/age": None}, "x_train has inputs ['age', 'scores'] but x_test has ['scores']", id="names"
        ),
        pytest.param({"x_train": np.zeros((20, 3))}, "has both x_train and x_train/<input>", id="both-forms"),
        pytest.param({"x_test/scores": np.array([["a"] * 3] * 5)}, "expected a numeric array", id="text-input"),
        pytest.param({"y_test": np.full(5, np.nan, np.float32)}, "NaN or infinite", id="nan"),
    ],
)
def test_bad_named_inputs_and_labels(tmp_path, overrides, message):
    with pytest.raises(TrainserveError) as err:
        load_dataset(str(_regression_npz(tmp_path / "r.npz", **overrides)))
    assert message in str(err.value)


def test_csv_columns_become_inputs_and_a_seeded_fraction_is_held_out(tmp_path):
    path = tmp_path / "t.csv"
    rows = ["size,rooms,kind,price"] + [f"{i * 1.5},{i % 4},{i % 3},{i * 2.0}" for i in range(20)]
    path.write_text("\n".join(rows) + "\n")
    ds = load_dataset(str(path), seed=1, label_column="price", test_fraction=0.25)
    assert sorted(ds.train) == ["kind", "rooms", "size"] and len(ds.y_test) == 5 and len(ds.y_train) == 15
    assert ds.train["rooms"].dtype == np.float32 and ds.train["size"].dtype == np.float32 and ds.tabular
    assert ds.train["size"].shape == (15,) and ds.task.kind == "regression"
    assert ds.fingerprint() == load_dataset(str(path), seed=1, label_column="price", test_fraction=0.25).fingerprint()
    by_kind = load_dataset(str(path), seed=1, label_column="kind", test_fraction=0.25)
    assert by_kind.task.kind == "classification" and by_kind.task.classes == 3
    ids = load_dataset(str(path), seed=1, label_column="price", test_fraction=0.25, categorical=("rooms",))
    assert ids.train["rooms"].dtype.kind == "U" and set(ids.train["rooms"]) <= {"0", "1", "2", "3"}
    with pytest.raises(TrainserveError, match="has no column 'cost': expected --label-column to name one of"):
        load_dataset(str(path), label_column="cost")
    with pytest.raises(TrainserveError, match="needs --label-column NAME"):
        load_dataset(str(path))


IRIS_LIKE = """size,colour,species
1.0,red,setosa
2.0,,versicolor
,blue,setosa
4.0,red,virginica
5.0,blue,versicolor
6.0,green,virginica
7.0,red,setosa
8.0,blue,virginica
"""


def test_csv_text_is_a_category_an_empty_cell_is_missing_and_label_names_are_sorted_classes(tmp_path):
    path = tmp_path / "iris.csv"
    path.write_text(IRIS_LIKE)
    ds = load_dataset(str(path), seed=0, label_column="species", test_fraction=0.25)
    assert ds.task.label_names == ("setosa", "versicolor", "virginica") and ds.task.classes == 3
    everything = {k: np.concatenate([ds.train[k], ds.test[k]]) for k in ds.train}
    assert everything["colour"].dtype.kind == "U" and "" in set(everything["colour"])
    assert everything["size"].dtype == np.float32 and np.isnan(everything["size"]).sum() == 1
    names = np.array(ds.label_names)
    truth = {line.split(",")[0] or "nan": line.split(",")[2] for line in IRIS_LIKE.splitlines()[1:]}
    sizes, labels = np.concatenate([ds.train["size"], ds.test["size"]]), np.concatenate([ds.y_train, ds.y_test])
    for size, label in zip(sizes, labels):
        assert truth[f"{size:.1f}" if size == size else "nan"] == names[label]


@pytest.mark.parametrize(
    "text, args, message",
    [
        pytest.param("a,b,y\n1,2,x\n3,4\n", {}, "line 3 has 2 fields: expected 3", id="ragged-row"),
        pytest.param("a,b,y\n1,,x\n3,,z\n", {}, "column 'b' is empty in every row", id="empty-column"),
        pytest.param("a,y\n1,x\n3,x\n4,x\n", {}, "y_train holds one class: expected at least 2", id="one-class"),
        pytest.param("a,y\n1,x\n3,\n4,z\n", {}, "label column 'y' is empty at line 3", id="empty-label"),
        pytest.param("a,y\n1,x\ninf,z\n4,z\n", {}, "line 3 is 'inf': expected a finite number", id="inf"),
        pytest.param("a,y\n1,x\n3,z\n", {"categorical": ("c",)}, "--categorical c: data file", id="categorical"),
        pytest.param("a,y\n", {}, "has a header but no rows", id="no-rows"),
        pytest.param(b"a,y\n1,\xff\n", {}, "is not a readable CSV", id="not-utf8"),
    ],
)
def test_bad_csv_is_one_line_before_training(tmp_path, text, args, message):
    path = tmp_path / "t.csv"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(TrainserveError) as err:
        load_dataset(str(path), label_column="y", test_fraction=0.34, **args)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_any_npz_layout_and_small_dtype_trains_and_its_split_is_one_eval_reads(tmp_path):
    """Fortran order (np.asfortranarray, .T, np.delete) and bool/float16/int8/uint16 inputs: accepted, and
    the shared split training writes streams in the eval client (C order)."""
    from trainserve.evaluation.data import open_eval_data

    rng = np.random.default_rng(0)
    arrays = {
        "x_train/f16": np.asfortranarray(rng.random((12, 3, 2)).astype(np.float16)),
        "x_train/flag": rng.random((12, 4)).T.T > 0.5,
        "x_train/small": np.asfortranarray(rng.integers(-5, 5, (12, 2)).astype(np.int8)),
        "x_train/wide": rng.integers(0, 60000, (12, 2)).astype(np.uint16),
        "y_train": np.arange(12) % 2,
    }
    arrays |= {k.replace("train", "test"): np.asfortranarray(v[:5]) for k, v in arrays.items()}
    np.savez(tmp_path / "f.npz", **arrays)
    ds = load_dataset(str(tmp_path / "f.npz"))
    assert all(v.flags.c_contiguous for v in ds.test.values())
    for source in (share_split(ds, tmp_path, "f"), tmp_path / "f.npz"):  # the split, and the file itself
        data = open_eval_data(str(source))
        columns, labels = next(data.batches(100))
        for name in ds.test:
            np.testing.assert_array_equal(columns[name], arrays[f"x_test/{name}"])
            assert columns[name].dtype == arrays[f"x_test/{name}"].dtype
        np.testing.assert_array_equal(labels, arrays["y_test"])


def test_npz_inputs_must_be_finite(tmp_path):
    x = np.ones((6, 2), np.float32)
    x[2, 1] = np.nan
    np.savez(tmp_path / "n.npz", x_train=x, y_train=np.arange(6) % 2, x_test=x, y_test=np.arange(6) % 2)
    with pytest.raises(TrainserveError, match="x_train holds NaN or infinite values: expected finite numbers"):
        load_dataset(str(tmp_path / "n.npz"))


def test_eval_reads_a_csv_as_text_and_maps_class_names_to_the_models_ids(tmp_path):
    from trainserve.evaluation.data import encode_labels, open_eval_data
    from trainserve.evaluation.plan import text_as

    path = tmp_path / "iris.csv"
    path.write_text(IRIS_LIKE)
    data = open_eval_data(str(path), label_column="species")
    columns, labels = next(data.batches(100))
    assert columns["colour"][1] == "" and labels[0] == "setosa"
    sizes = text_as(columns["size"], np.dtype(np.float32), "size")
    assert sizes.dtype == np.float32 and np.isnan(sizes[2]) and sizes[0] == 1.0
    assert text_as(columns["colour"], np.dtype(object), "colour").tolist()[:2] == [b"red", b""]
    encoded = encode_labels(data, ["virginica", "setosa", "versicolor"], "model 'm'")
    assert encoded.labels.tolist()[:3] == [1, 2, 1] and encoded.label_names[0] == "virginica"
    with pytest.raises(TrainserveError, match="label names virginica are not classes of model 'm'"):
        encode_labels(data, ["setosa", "versicolor"], "model 'm'")
