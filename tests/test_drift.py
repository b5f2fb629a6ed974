"""`trainserve drift`: captured inputs against the training profile of the version that answered them.

A table of a number with missing cells (`age`), a skewed number (`income`) and two categories (`colour`, `size`),
as a CSV gives them, profiled as training profiles it. Traffic drawn from the same distribution drifts nowhere;
traffic with `age` shifted by one standard deviation and a new colour names exactly those two, with PSI and the
Jensen-Shannon distance equal to an independent numpy/scipy computation over the same bins."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy.spatial.distance import jensenshannon

from captures import write_batches
from trainserve.cli import main
from trainserve.data import Dataset
from trainserve.data_profile import profile_path
from trainserve.drift.report import validate_report
from trainserve.task import Task
from trainserve.training.data_profile import write_data_profile

COLOURS, SIZES = np.array(["red", "green", "blue"]), np.array(["S", "M", "L"])


def table(rows: int, seed: int, age_shift: float = 0.0, new_colour: float = 0.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    age = rng.normal(40 + age_shift, 10, rows).astype(np.float32)
    age[rng.random(rows) < 0.05] = np.nan
    colour = COLOURS[rng.choice(3, rows, p=[0.5, 0.3, 0.2])].astype(object)
    colour[rng.random(rows) < new_colour] = "purple"
    return {
        "age": age,
        "income": rng.lognormal(10, 0.5, rows).astype(np.float32),
        "colour": colour.astype(str),
        "size": SIZES[rng.choice(3, rows)],
    }


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("drift-data")
    train = table(6000, 0)
    dataset = Dataset(
        "people",
        train,
        np.zeros(6000, np.int64),
        table(10, 1),
        np.zeros(10, np.int64),
        Task("classification", classes=2),
        single=False,
        tabular=True,
    )
    write_data_profile(root, "people", 1, dataset)
    return root, train


def capture(directory, inputs: dict[str, np.ndarray], batch: int = 25):
    rows = len(next(iter(inputs.values())))
    batches = [{k: v[i : i + batch] for k, v in inputs.items()} for i in range(0, rows, batch)]
    write_batches(directory, "people", batches, per_file=20)
    return directory


def drift_cli(tmp_path, data_dir, *args) -> tuple[int, dict]:
    report = tmp_path / "drift.json"
    code = main(["drift", *map(str, args), "--model", "people", "--data-dir", str(data_dir), "--report", str(report)])
    return code, json.loads(report.read_text()) if report.is_file() else None


@pytest.mark.unit
def test_traffic_from_the_training_distribution_does_not_drift(data_dir, tmp_path):
    root, _ = data_dir
    code, report = drift_cli(tmp_path, root, capture(tmp_path / "cap", table(3000, 7)))
    validate_report(report)
    assert code == 0 and report["passed"] and report["drifted"] == []
    rows = {r["feature"]: r for r in report["versions"][0]["features"]}
    assert set(rows) == {"age", "income", "colour", "size"}
    assert all(r["psi"] < 0.02 and r["js_distance"] < 0.05 for r in rows.values()), rows
    assert rows["colour"]["unseen_share"] == 0.0 and report["versions"][0]["examples"] == 3000


@pytest.mark.unit
def test_a_shifted_column_and_a_new_category_are_named_with_their_effect_sizes(data_dir, tmp_path, capsys):
    root, train = data_dir
    traffic = table(3000, 8, age_shift=10.0, new_colour=0.2)
    code, report = drift_cli(tmp_path, root, capture(tmp_path / "cap", traffic))
    validate_report(report)
    assert code == 1 and sorted(d["feature"] for d in report["drifted"]) == ["age", "colour"]
    section = report["versions"][0]
    assert {r["feature"] for r in section["features"][:2]} == {"age", "colour"}  # most drifted first
    rows = {r["feature"]: r for r in section["features"]}
    # Independently: deciles of the training ages as bin edges, numpy histograms, PSI by its formula, scipy's JS.
    finite = train["age"][np.isfinite(train["age"])].astype(np.float64)
    edges = np.unique(np.percentile(finite, np.arange(10, 100, 10)))
    bins = np.concatenate([[-np.inf], edges, [np.inf]])

    def shares(values):
        counts = np.append(np.histogram(values[np.isfinite(values)], bins)[0], np.isnan(values).sum())
        return counts / counts.sum()

    e, a = shares(train["age"].astype(np.float64)), shares(traffic["age"].astype(np.float64))
    psi = np.sum((np.maximum(a, 1e-4) - np.maximum(e, 1e-4)) * np.log(np.maximum(a, 1e-4) / np.maximum(e, 1e-4)))
    assert rows["age"]["psi"] == pytest.approx(psi, rel=1e-9) and psi > 0.25
    assert rows["age"]["js_distance"] == pytest.approx(jensenshannon(e, a, base=2), rel=1e-9)
    assert rows["age"]["mean_shift_sd"] == pytest.approx(1.0, abs=0.1)
    purple = np.mean(traffic["colour"] == "purple")
    assert rows["colour"]["unseen_share"] == pytest.approx(purple) and rows["colour"]["top_unseen"] == ["purple"]
    names = ["red", "green", "blue"]
    e = np.array([np.sum(train["colour"] == c) for c in names] + [0]) / len(train["colour"])
    a = np.array([np.sum(traffic["colour"] == c) for c in [*names, "purple"]]) / len(traffic["colour"])
    assert rows["colour"]["js_distance"] == pytest.approx(jensenshannon(e, a, base=2), rel=1e-9)
    e, a = np.maximum(e, 1e-4), np.maximum(a, 1e-4)
    assert rows["colour"]["psi"] == pytest.approx(np.sum((a - e) * np.log(a / e)), rel=1e-9)
    assert rows["income"]["psi"] < 0.02 and rows["size"]["psi"] < 0.02
    err = capsys.readouterr().err
    assert "v1 age: PSI 0.8" in err and "unseen categories 20.0% > 1.0%" in err
    page = (tmp_path / "drift.html").read_text()
    assert "DRIFT" in page and 'id="drift-v1"' in page and 'src="data:image/png;base64,' in page


@pytest.mark.unit
def test_a_version_without_a_profile_is_one_line(data_dir, tmp_path, capsys):
    root, _ = data_dir
    assert profile_path(root, "people", 1).is_file()
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _ = drift_cli(tmp_path, empty, capture(tmp_path / "cap", table(50, 9)))
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "no data profile for model 'people' version 1" in err


@pytest.mark.unit
def test_training_profiles_its_data_and_held_out_images_do_not_drift(trained_digits, tmp_path):
    """`trainserve train --data-dir` writes the profile beside the version's record (the session's digits run);
    the held-out images, captured as requests, are the training distribution; a brightened copy is not."""
    data = trained_digits / "data"
    profile = json.loads(profile_path(data, "digits", 1).read_text())
    assert set(profile["features"]) == {"images.brightness", "images.size"}
    assert profile["features"]["images.size"]["categories"] == {"8x8x1": profile["examples"]}
    with np.load(data / "digits" / "test.npz") as split:
        images = split["x_test"]
    batches = [{"images": images[i : i + 16]} for i in range(0, len(images), 16)]
    write_batches(tmp_path / "same", "digits", batches)
    code, report = main_drift(tmp_path / "same", data, tmp_path / "same.json")
    assert code == 0, report["drifted"]
    brighter = [{"images": np.minimum(b["images"].astype(np.int64) * 2 + 40, 255).astype(np.uint8)} for b in batches]
    write_batches(tmp_path / "bright", "digits", brighter)
    code, report = main_drift(tmp_path / "bright", data, tmp_path / "bright.json")
    assert code == 1 and [d["feature"] for d in report["drifted"]] == ["images.brightness"]


def main_drift(captures, data_dir, report) -> tuple[int, dict]:
    code = main(["drift", str(captures), "--model", "digits", "--data-dir", str(data_dir), "--report", str(report)])
    return code, json.loads(report.read_text())


@pytest.mark.integration
def test_image_files_are_profiled_by_size_channels_and_brightness(tmp_path):
    """An image folder's training profile (the files' bytes, as clients send them): the training files sent as
    traffic do not drift; the same files brightened (same sizes, same channels) drift on brightness alone."""
    import io

    from image_files import write_image_folder
    from PIL import Image, ImageEnhance

    from trainserve.data import ImageFormat
    from trainserve.sources import load_dataset

    folder = write_image_folder(tmp_path / "photos", per_class=24)
    dataset = load_dataset(str(folder), image=ImageFormat(32, 32, 3), test_fraction=0.25)
    write_data_profile(tmp_path / "data", "shapes", 1, dataset)
    features = json.loads(profile_path(tmp_path / "data", "shapes", 1).read_text())["features"]
    assert set(features) == {f"image_bytes.{f}" for f in ("brightness", "channels", "height", "width")}
    assert set(features["image_bytes.channels"]["categories"]) <= {"1", "3", "4"}
    files = [Path(p).read_bytes() for p in dataset.train["image_bytes"]]

    def brightened(data: bytes) -> bytes:
        """2.5 times as bright, the same size and number of channels."""
        image, out = Image.open(io.BytesIO(data)), io.BytesIO()
        mode = {1: "L", 3: "RGB", 4: "RGBA"}[len(image.getbands())]
        ImageEnhance.Brightness(image.convert("RGB")).enhance(2.5).convert(mode).save(out, "PNG")
        return out.getvalue()

    for name, sent in (("same", files), ("bright", [brightened(f) for f in files])):
        batches = [{"image_bytes": np.array(sent[i : i + 4], dtype=object)} for i in range(0, len(sent), 4)]
        write_batches(tmp_path / name, "shapes", batches)
    code, report = main_drift_model(tmp_path / "same", tmp_path / "data", tmp_path / "same.json", "shapes")
    assert code == 0, report["drifted"]
    code, report = main_drift_model(tmp_path / "bright", tmp_path / "data", tmp_path / "bright.json", "shapes")
    assert code == 1 and [d["feature"] for d in report["drifted"]] == ["image_bytes.brightness"], report["drifted"]


def main_drift_model(captures, data_dir, report, model) -> tuple[int, dict]:
    code = main(["drift", str(captures), "--model", model, "--data-dir", str(data_dir), "--report", str(report)])
    return code, json.loads(report.read_text())


@pytest.mark.integration
def test_shards_merge_into_the_one_client_report_with_nan_and_infinite_inputs_counted(data_dir, tmp_path):
    """Traffic whose `age` is NaN throughout, `income` infinite in places and a new colour: each side's NaN and
    infinite values are counted per feature (equal to numpy's count), no NaN reaches the JSON (drift-merge reads
    it strictly), and three shards' reports merge into the report one client wrote."""
    from trainserve.drift.report import SCHEMA_PATH
    from trainserve.evidence.document import read_document

    root, _ = data_dir
    traffic = table(2000, 11, new_colour=0.2)
    traffic["age"][:] = np.nan
    traffic["income"][::7] = np.inf
    traffic["income"][3::7] = -np.inf
    captured = capture(tmp_path / "cap", traffic)
    _, whole = drift_cli(tmp_path / "whole", root, captured)
    read_document(tmp_path / "whole" / "drift.json", "drift", SCHEMA_PATH)  # strict JSON, schema-valid
    rows = {r["feature"]: r for r in whole["versions"][0]["features"]}
    assert rows["age"]["non_finite"]["traffic"] == {"nan": 2000, "infinite": 0}
    assert rows["age"]["mean_traffic"] is None and rows["age"]["mean_shift_sd"] is None
    infinite = int(np.isinf(traffic["income"]).sum())
    assert rows["income"]["non_finite"]["traffic"] == {"nan": 0, "infinite": infinite} and infinite == 572
    finite_income = traffic["income"][np.isfinite(traffic["income"])].astype(np.float64)
    assert rows["income"]["mean_traffic"] == pytest.approx(finite_income.mean(), rel=1e-6)
    assert rows["age"]["non_finite"]["training"]["nan"] == rows["age"]["bins"]["training"][-1] > 0
    assert rows["colour"]["non_finite"] is None
    paths = []
    for i in range(3):
        drift_cli(tmp_path / f"s{i}", root, captured, "--shard", f"{i}/3")
        paths.append(str(tmp_path / f"s{i}" / "drift.json"))
    assert main(["drift-merge", *paths, "--output", str(tmp_path / "merged.json")]) == 1
    merged = read_document(tmp_path / "merged.json", "drift", SCHEMA_PATH).report
    for mine, theirs in zip(merged["versions"][0]["features"], whole["versions"][0]["features"], strict=True):
        assert (mine["feature"], mine["bins"], mine["unseen_share"], mine["non_finite"], mine["noise"]) == (
            theirs["feature"],
            theirs["bins"],
            theirs["unseen_share"],
            theirs["non_finite"],
            theirs["noise"],
        )
        assert (mine["psi"], mine["js_distance"]) == pytest.approx((theirs["psi"], theirs["js_distance"]), rel=1e-12)
    assert merged["drifted"] == whole["drifted"] and merged["versions"][0]["examples"] == 2000
    assert sorted(d["feature"] for d in merged["drifted"]) == ["age", "colour"]
    page = (tmp_path / "merged.html").read_text()
    assert "NaN / infinite" in page and f"<td>0/{infinite}</td>" in page and "<td>2000/0</td>" in page
    assert main(["drift-merge", *paths[:2], "--output", str(tmp_path / "m2.json")]) == 2


@pytest.mark.unit
def test_a_version_without_a_profile_is_left_out_and_named_while_the_others_are_compared(data_dir, tmp_path, capsys):
    """Version 1 has a profile, version 2 (serving the same capture) has none: version 1 is judged, version 2's
    requests are counted and named, in one line, not a stop of the run."""
    from captures import capture_name, prediction_log, write_capture

    root, _ = data_dir
    traffic = table(120, 13)
    records = [
        prediction_log("people", {k: v[i : i + 10] for k, v in traffic.items()}, version=1 + (i // 10) % 2)
        for i in range(0, 120, 10)
    ]
    write_capture(tmp_path / "cap" / capture_name(0), records)
    code, report = drift_cli(tmp_path, root, tmp_path / "cap")
    validate_report(report)
    assert code == 0 and [s["version"] for s in report["versions"]] == [1]
    assert report["versions"][0]["records"] == 6 and report["versions"][0]["examples"] == 60
    assert report["unprofiled_versions"] == [
        {"version": 2, "records": 6, "profile": str(profile_path(root, "people", 2))}
    ]
    said = f"v2: 6 captured requests not compared: no data profile ({profile_path(root, 'people', 2)})"
    assert capsys.readouterr().err.strip().splitlines() == [f"trainserve drift: {said}"]
    assert "v2: 6 captured requests not compared" in (tmp_path / "drift.html").read_text()


@pytest.mark.unit
def test_limit_counts_exactly_that_many_requests(data_dir, tmp_path):
    root, _ = data_dir
    code, report = drift_cli(tmp_path, root, capture(tmp_path / "cap", table(250, 14), batch=5), "--limit", "6")
    validate_report(report)
    section = report["versions"][0]
    assert (section["records"], section["examples"], report["capture"]["kept"]) == (6, 30, 6)
    assert report["capture"]["limit"] == 6 and sum(r["traffic_count"] for r in section["features"][:1]) == 30
    assert "6 captured requests, 30 examples" in (tmp_path / "drift.html").read_text()


@pytest.mark.integration
def test_the_page_draws_every_plot_at_one_size_and_numeric_bins_by_their_values(data_dir, tmp_path, monkeypatch):
    """Four features: four PNGs of one pixel size in a grid of equal columns (a flex row stretched the fourth to
    the page's width); a number's bins are labelled by the training deciles' values, a category's by its names."""
    import base64
    import re
    import struct

    from trainserve import plots

    drawn = {}
    real = plots.plot_distributions

    def spy(edges, expected, observed, out, title, labels=None, axis=None):
        drawn[title.split(":")[0]] = (labels, axis)
        return real(edges, expected, observed, out, title, labels=labels, axis=axis)

    monkeypatch.setattr(plots, "plot_distributions", spy)
    root, _ = data_dir
    drift_cli(tmp_path, root, capture(tmp_path / "cap", table(400, 15, age_shift=10.0)))
    page = (tmp_path / "drift.html").read_text()
    grids = re.findall(r'<div class="plots" style="([^"]*)">', page)
    assert grids == ["display:grid;grid-template-columns:repeat(2,minmax(0,1fr));gap:1em"]
    sizes = {
        struct.unpack(">II", base64.b64decode(uri)[16:24])
        for uri in re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    }
    assert len(re.findall(r"<img ", page)) == 4 and len(sizes) == 1, sizes
    report = json.loads((tmp_path / "drift.json").read_text())
    age = next(r for r in report["versions"][0]["features"] if r["feature"] == "age")
    labels, axis = drawn["age"]
    edges = age["edges"]
    assert axis.startswith("value") and len(labels) == len(age["bins"]["training"]) == len(edges) + 2
    assert labels[0] == f"<{edges[0]:.3g}" and labels[1] == f"{edges[0]:.3g}-{edges[1]:.3g}" and labels[-1] == "NaN"
    income = next(r for r in report["versions"][0]["features"] if r["feature"] == "income")
    assert drawn["income"][0][1] == f"{income['edges'][0] / 1000:.3g}k-{income['edges'][1] / 1000:.3g}k"
    assert drawn["colour"] == (["red", "green", "blue", "<unseen>"], "category")
