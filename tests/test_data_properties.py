"""Property-based: data files as people make them (npz: dtype x memory order x shape x number of inputs x
missing values; CSV: numbers, integers, text, declared ids, empty cells, label kinds). Train's loader
accepts or gives a one-line error; whatever it accepts, the split it writes and the file itself are what
the eval client reads, and the model built on it is served with the same predictions in process, by the
exported SavedModel, and over real gRPC. Seeded (derandomized) and bounded, so `make test` runs it as is."""

from __future__ import annotations

import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from conftest import free_port, share_split
from trainserve.data import Dataset
from trainserve.errors import TrainserveError
from trainserve.sources import load_dataset

NPZ_DTYPES = ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "bool"]
SHAPES = [(), (1,), (3,), (2, 3)]
WORDS = ["red", "green", "blue", "a b", "Ünï", "x,y"]  # a comma, a space, non-ASCII: CSV quoting and UTF-8


@dataclass
class DataFile:
    """A generated data file: what to write and how train is told to read it."""

    kind: str  # npz | csv
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    rows: list[list[str]] = field(default_factory=list)
    categorical: tuple[str, ...] = ()
    byte_order_mark: bool = False  # a CSV as Excel saves it ("CSV UTF-8"): the file starts with U+FEFF

    def write(self, directory: Path) -> Path:
        path = directory / f"data.{self.kind}"
        if self.kind == "npz":
            np.savez(path, **self.arrays)
        else:
            import csv

            with open(path, "w", newline="", encoding="utf-8-sig" if self.byte_order_mark else "utf-8") as fh:
                csv.writer(fh).writerows(self.rows)
        return path

    def load(self, path: Path) -> Dataset:
        return load_dataset(str(path), label_column="y", test_fraction=0.3, categorical=self.categorical)


def _array(rng, dtype: np.dtype, shape: tuple, fortran: bool, missing: bool) -> np.ndarray:
    if dtype.kind == "b":
        x = rng.random(shape) > 0.5
    elif dtype.kind == "f":
        x = (rng.standard_normal(shape) * 3).astype(dtype)
        if missing and x.size:
            x.flat[rng.integers(0, x.size)] = np.nan
    else:
        info = np.iinfo(dtype)
        x = rng.integers(max(info.min, -100), min(info.max, 1000), shape).astype(dtype)
    return np.asfortranarray(x) if fortran else x


@st.composite
def npz_files(draw) -> DataFile:
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    n = {"train": draw(st.integers(4, 12)), "test": draw(st.integers(1, 4))}
    count = draw(st.integers(1, 3))
    single = count == 1 and draw(st.booleans())
    arrays = {}
    for i in range(count):
        dtype, shape = np.dtype(draw(st.sampled_from(NPZ_DTYPES))), draw(st.sampled_from(SHAPES))
        fortran, missing = draw(st.booleans()), draw(st.booleans()) and draw(st.booleans())
        for split in ("train", "test"):
            key = f"x_{split}" if single else f"x_{split}/in{i}"
            arrays[key] = _array(rng, dtype, (n[split], *shape), fortran, missing)
    classes = draw(st.sampled_from([0, 2, 3]))  # 0: regression
    for split in ("train", "test"):
        y = rng.integers(0, classes, n[split]) if classes else rng.standard_normal(n[split]).astype(np.float32)
        arrays[f"y_{split}"] = y
    return DataFile("npz", arrays)


@st.composite
def csv_files(draw) -> DataFile:
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    rows, kinds = (
        draw(st.integers(5, 14)),
        draw(st.lists(st.sampled_from(["float", "int", "text", "ids"]), min_size=1, max_size=3)),
    )
    empty = draw(st.sampled_from([0.0, 0.2, 0.9]))
    columns = {}
    for i, kind in enumerate(kinds):
        values = {
            "float": lambda: f"{rng.standard_normal() * 10:.3f}",
            "int": lambda: str(int(rng.integers(-5, 50))),
            "text": lambda: str(rng.choice(WORDS)),
            "ids": lambda: str(int(rng.integers(0, 4))),
        }[kind]
        columns[f"c{i}"] = [values() if rng.random() >= empty else "" for _ in range(rows)]
    label = draw(st.sampled_from(["names", "ids", "floats"]))
    columns["y"] = [
        {
            "names": lambda: str(rng.choice(["cat", "dog", "émeu"])),
            "ids": lambda: str(int(rng.integers(0, 3))),
            "floats": lambda: f"{rng.standard_normal():.4f}",
        }[label]()
        for _ in range(rows)
    ]
    table = [list(columns)] + [[columns[c][r] for c in columns] for r in range(rows)]
    categorical = tuple(f"c{i}" for i, kind in enumerate(kinds) if kind == "ids")
    return DataFile("csv", rows=table, categorical=categorical, byte_order_mark=draw(st.booleans()))


def data_files():
    return st.one_of(npz_files(), csv_files())


def _accepted(case: DataFile, directory: Path) -> tuple[Path, Dataset] | None:
    """The data set train builds, or None after checking the refusal is one line naming what was expected."""
    path = case.write(directory)
    try:
        accepted = path, case.load(path)
    except TrainserveError as exc:
        message = str(exc)
        assert "\n" not in message and "expected" in message, message
        assert "\ufeff" not in message and "\\ufeff" not in message, f"a byte-order mark in a name: {message}"
        event(f"{case.kind} refused: {message.split(': ', 1)[-1][:60]}")  # --hypothesis-show-statistics
        return None
    event(f"{case.kind} accepted")
    return accepted


def _assert_same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.dtype, got.shape, want.dtype, want.shape)
    np.testing.assert_array_equal(got, want, err_msg=what)  # NaN equals NaN here


@pytest.mark.unit
@settings(max_examples=60, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=data_files())
def test_train_accepts_or_says_why_and_eval_reads_what_train_read(case):
    from trainserve.evaluation.data import encode_labels, open_eval_data
    from trainserve.evaluation.plan import text_as
    from trainserve.training.model_fn import data_spec

    with tempfile.TemporaryDirectory() as tmp:
        accepted = _accepted(case, Path(tmp))
        if accepted is None:
            return
        path, ds = accepted
        spec = data_spec(ds.train, ds.task, tabular=ds.tabular)
        assert [i.name for i in spec.inputs] == list(ds.train)
        if case.kind == "csv":  # the header's names, not a byte-order mark's '\ufeffc0'
            assert sorted(ds.train) == sorted(name for name in case.rows[0] if name != "y")
        split = open_eval_data(str(share_split(ds, Path(tmp), "m")))
        columns, labels = next(split.batches(10_000))
        for name, want in ds.test.items():
            _assert_same(columns[name], want, f"split {name}")
        _assert_same(labels, ds.y_test, "split labels")
        raw = open_eval_data(str(path), label_column="y")  # the file itself, as eval reads it
        columns, labels = next(raw.batches(10_000))
        if case.kind == "npz":
            for name, want in ds.test.items():
                np.testing.assert_array_equal(columns[name].reshape(want.shape), want, err_msg=name)
            return
        everything = {k: np.concatenate([ds.train[k], ds.test[k]]) for k in ds.train}
        for name, want in everything.items():
            got = columns[name] if want.dtype.kind == "U" else text_as(columns[name], want.dtype, name)
            assert sorted(map(str, got)) == sorted(map(str, want)), name  # the same cells (rows are shuffled)
        if labels.dtype.kind == "U":
            assert sorted(encode_labels(raw, ds.label_names, "m").labels) == sorted([*ds.y_train, *ds.y_test])


@pytest.mark.unit
@pytest.mark.parametrize("label_first", [False, True], ids=["input-first", "label-first"])
def test_a_csv_saved_by_excel_trains_and_evaluates_under_its_header_names(tmp_path, label_first):
    """Excel's "CSV UTF-8" starts with a byte-order mark, which is not part of the first column's name."""
    from trainserve.evaluation.data import open_eval_data

    header, rows = ["size", "kind", "price"], [[f"{i}.5", "ab"[i % 2], str(i * 10)] for i in range(10)]
    if label_first:
        header, rows = header[::-1], [row[::-1] for row in rows]
    path = tmp_path / "houses.csv"
    path.write_bytes("\r\n".join(",".join(row) for row in [header, *rows]).encode("utf-8-sig"))
    assert path.read_bytes().startswith(b"\xef\xbb\xbf")
    ds = load_dataset(str(path), label_column="price", test_fraction=0.3)
    assert sorted(ds.train) == ["kind", "size"]
    assert ds.train["size"].dtype.kind == "f", "the first column's numbers are still numbers"
    columns, labels = next(open_eval_data(str(path), label_column="price").batches(100))
    assert sorted(columns) == ["kind", "size"]
    assert sorted(labels.tolist()) == sorted(float(row[header.index("price")]) for row in rows)


TINY_MODEL = """
import keras

def build_model(spec):
    inputs = spec.keras_inputs()
    flat = [keras.layers.Flatten()(keras.ops.cast(keras.ops.reshape(inputs[i.name], (-1, *i.shape, 1)), "float32"))
            for i in spec.inputs]
    x = flat[0] if len(flat) == 1 else keras.layers.Concatenate()(flat)
    activation = "softmax" if spec.task.kind == "classification" else None
    return keras.Model(inputs, keras.layers.Dense(spec.output_units, activation=activation, dtype="float32")(x))
"""


class InProcessServer:
    """serve-local's own server loop, in a thread of this process, on a free port."""

    def __init__(self, base: Path):
        from trainserve.serving.config import ServerOptions
        from trainserve.serving.server import serve

        self.port, self.stop = free_port(), threading.Event()
        options = ServerOptions(port=self.port, model_name="m", model_base_path=str(base))
        self.thread = threading.Thread(target=serve, args=(options, self.stop), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


@pytest.mark.integration
@settings(max_examples=5, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=data_files())
def test_what_train_accepts_is_served_with_the_in_process_predictions(case):
    import keras

    from trainserve.client import ServingClient, Target
    from trainserve.evaluation.data import open_eval_data
    from trainserve.evaluation.plan import plan_requests
    from trainserve.savedmodel import LoadedModel
    from trainserve.training.export import export_savedmodel, serving_outputs
    from trainserve.training.model import build_network
    from trainserve.training.model_fn import data_spec, input_structure

    with tempfile.TemporaryDirectory() as tmp:
        accepted = _accepted(case, Path(tmp))
        if accepted is None:
            return
        _, ds = accepted
        (Path(tmp) / "tiny.py").write_text(TINY_MODEL)
        keras.utils.set_random_seed(0)
        spec = data_spec(ds.train, ds.task, tabular=ds.tabular)
        model = build_network(f"{tmp}/tiny.py:build_model", spec)
        in_process = serving_outputs(model(input_structure(model)(ds.test), training=False), ds.task)
        version = Path(tmp) / "models" / "1"
        export_savedmodel(model, version, spec.inputs, ds.task, spec.preprocessing)
        data = open_eval_data(str(share_split(ds, Path(tmp), "m")))
        server = InProcessServer(version.parent)
        client = ServingClient(f"127.0.0.1:{server.port}", 4 << 20)
        try:
            target = Target("m")
            client.wait_until_available(target, 60)
            plan, data = plan_requests(client.signature(target, None), data, target)
            inputs = plan.request_inputs(next(data.batches(10_000))[0])
            served = client.predict(target, inputs, plan.output_filter, None, 0).outputs
            local = LoadedModel(version).run("serving_default", inputs, plan.output_filter)
        finally:
            client.close()
            server.close()
        for key in plan.output_filter:
            np.testing.assert_array_equal(served[key], local[key], err_msg=f"gRPC vs SavedModel: {key}")
        np.testing.assert_allclose(local[plan.output], np.asarray(in_process[plan.output]), atol=1e-5)
