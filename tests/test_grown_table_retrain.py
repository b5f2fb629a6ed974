"""The everyday retrain, through the CLI: a CSV that grows between trainings (same file, rows appended) and is
retrained with another --seed compares fairly: eval counts the baseline's rows as `disjoint` with the number
checked, and promote accepts the report with no override. Another salt (or a larger fraction) holds out rows
the baseline trained on: `overlapping`, with the exact count, checked against the rows training wrote.

Three tiny trainings of one table (1 epoch), served side by side in this process (real gRPC).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from serving_fixtures import serve_every_version
from trainserve.cli import main

pytestmark = [pytest.mark.unit, pytest.mark.xdist_group("grown-table")]

MODEL = "table"


def table_rows(start: int, stop: int) -> list[str]:
    """`id,a,b,label` rows: integer features (exact in float32), label = a + b > 0."""
    rng = np.random.default_rng(start)
    a, b = rng.integers(-20, 21, stop - start), rng.integers(-20, 21, stop - start)
    return [f"{i},{x},{y},{int(x + y > 0)}" for i, x, y in zip(range(start, stop), a, b)]


def train_cli(root, csv, *flags) -> None:
    dirs = ["--export-base", root / "models", "--data-dir", root / "data", "--logs-dir", root / "logs"]
    args = ["train", "--model-name", MODEL, "--data", csv, "--label-column", "label", "--epochs", 1, *dirs, *flags]
    assert main([str(a) for a in args]) == 0


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    """v1: 300 rows; v2: the same file with 150 rows appended, --seed 7; v3: v2's data, --split-salt other.
    Yields the server and the root."""
    root = tmp_path_factory.mktemp("grown")
    csv = root / "table.csv"
    csv.write_text("\n".join(["id,a,b,label", *table_rows(0, 300)]) + "\n")
    train_cli(root, csv)
    with open(csv, "a") as fh:
        fh.write("\n".join(table_rows(300, 450)) + "\n")
    train_cli(root, csv, "--seed", 7)
    train_cli(root, csv, "--split-salt", "other")
    server = serve_every_version(root / "models.config", MODEL, root / "models" / MODEL, (1, 2, 3))
    yield server, root
    assert server.stop() == 0


def held_out_ids(root, version: int) -> set[int]:
    """The ids of the rows a version's training held out, read from the split file it wrote."""
    record = json.loads((root / "data" / MODEL / "versions" / f"{version}.json").read_text())["test_split"]
    with np.load(root / "data" / MODEL / record["file"]) as npz:
        return {int(i) for i in npz["x_test/id"]}


def compare(server, root, tmp_path, candidate: int, baseline: int) -> tuple[int, dict]:
    report = tmp_path / f"{candidate}-vs-{baseline}.json"
    flags = ["--server", server.target, "--model", MODEL, "--data-dir", root / "data", "--report", report]
    gates = ["--version", candidate, "--compare-with", baseline, "--max-drop", "accuracy=0.5", "--min-accuracy", 0.1]
    code = main(["eval", *map(str, flags), *map(str, gates)])
    return code, json.loads(report.read_text())


def promote(root, tmp_path, candidate: int, stable: int, report) -> int:
    config = tmp_path / "models.config"
    labels = " ".join(
        f'version_labels {{ key: "{k}" value: {v} }}' for k, v in {"candidate": candidate, "stable": stable}.items()
    )
    config.write_text(
        f'model_config_list {{ config {{ name: "{MODEL}" base_path: "{root / "models" / MODEL}" model_platform: '
        f'"tensorflow" model_version_policy {{ specific {{ versions: {min(candidate, stable)} versions: '
        f"{max(candidate, stable)} }} }} {labels} }} }}\n"
    )
    path = tmp_path / "promoted.json"
    path.write_text(json.dumps(report))
    return main(["promote", "--config", str(config), "--report", str(path)])


def test_a_grown_table_retrained_with_another_seed_compares_on_rows_the_baseline_held_out(grown, tmp_path, capsys):
    server, root = grown
    code, report = compare(server, root, tmp_path, 2, 1)
    rows = report["evidence"]["baseline"]
    assert code == 0 and rows["rows"] == "disjoint", rows
    assert rows["rows_checked"] == report["data"]["examples"] == len(held_out_ids(root, 2)) > 50
    assert rows["rows_overlapping"] == 0 and report["evidence"]["kind"] == "own-split"
    assert held_out_ids(root, 2) - set(range(300, 450)) == held_out_ids(root, 1)  # v1's held-out rows stayed out
    assert promote(root, tmp_path, 2, 1, report) == 0
    assert "stable -> 2" in capsys.readouterr().out


def test_rows_the_baseline_could_have_trained_on_are_counted_exactly(grown, tmp_path, capsys):
    server, root = grown
    code, report = compare(server, root, tmp_path, 3, 2)
    rows = report["evidence"]["baseline"]
    expected = len(held_out_ids(root, 3) - held_out_ids(root, 2))  # v2 trained on every other row of the file
    assert code == 1 and rows["rows"] == "overlapping" and report["passed"] is False
    assert rows["rows_overlapping"] == expected > 0 and rows["rows_checked"] == report["data"]["examples"]
    assert f"{expected} of the {rows['rows_checked']} rows" in rows["said"]
    assert promote(root, tmp_path, 3, 2, report) == 2
    assert "comparison is biased" in capsys.readouterr().err
