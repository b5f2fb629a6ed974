"""`trainserve proxy export`: captured inputs as an .npz eval set, one row per example, keyed by request id."""

from __future__ import annotations

import numpy as np
import pytest

from captures import write_batches
from trainserve.cli import main

pytestmark = pytest.mark.unit


def test_inputs_come_out_row_by_row_with_their_request_ids(tmp_path, capsys):
    rng = np.random.default_rng(0)
    sizes = [3, 1, 2, 4]
    batches = [
        {"x": rng.normal(size=(n, 3)).astype(np.float32), "colour": np.array(["red", "blüe", "", "green"][:n])}
        for n in sizes
    ]
    ids = write_batches(tmp_path / "cap", "m", batches, per_file=3)
    out = tmp_path / "traffic.npz"
    assert main(["proxy", "export", str(tmp_path / "cap"), "--model", "m", "--to", str(out)]) == 0
    assert f"{sum(sizes)} examples of 4 captured requests" in capsys.readouterr().out
    with np.load(out) as npz:  # no pickle needed
        np.testing.assert_array_equal(npz["x_test/x"], np.concatenate([b["x"] for b in batches]))
        assert npz["x_test/colour"].tolist() == [v for b in batches for v in b["colour"].tolist()]
        assert npz["request_id"].tolist() == [i for i, n in zip(ids, sizes) for _ in range(n)]
        assert npz["request_row"].tolist() == [r for n in sizes for r in range(n)]
        assert set(npz["version"].tolist()) == {1} and len(npz["timestamp_s"]) == sum(sizes)


def test_examples_of_several_shapes_are_one_line(tmp_path, capsys):
    batches = [{"images": np.zeros((1, 8, 8), np.uint8)}, {"images": np.zeros((1, 9, 9), np.uint8)}]
    write_batches(tmp_path / "cap", "m", batches)
    assert main(["capture", "export", str(tmp_path / "cap"), "--model", "m", "--to", str(tmp_path / "t.npz")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "input 'images' has examples of several shapes ([8, 8], [9, 9])" in err
