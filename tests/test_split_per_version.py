"""Each version keeps its own held-out split: content-addressed, recorded in its trainserve.json and in
`<data-dir>/<model>/versions/<v>.json`, never overwritten by a later training; eval checks its data against
the served version's record and refuses to pass a version on rows it trained on."""

from __future__ import annotations

import hashlib
import json

import pytest

from conftest import target_flags
from trainserve.cli import main
from trainserve.hashed_split import HashedSplit
from trainserve.layout import read_metadata, split_arrays
from trainserve.sources import load_dataset
from trainserve.splits import HeldOutSplit, fingerprint_arrays, fingerprint_npz, known_overlap, provenance

pytestmark = pytest.mark.xdist_group(
    "two-trainings"
)  # two_trainings made once, with test_evidence_chain's (conftest.py)


@pytest.mark.unit
def test_fingerprint_is_the_same_from_the_arrays_and_from_the_file(tmp_path):
    ds = load_dataset("digits", seed=2)
    split = HeldOutSplit(ds.test, ds.y_test, ds.task, ds.single, provenance("digits", 2, 0.2))
    path = split.share(tmp_path, "m")
    assert path == tmp_path / "m" / "splits" / f"{split.fingerprint}.npz"
    assert fingerprint_npz(path) == fingerprint_npz(tmp_path / "m" / "test.npz") == split.fingerprint
    assert split.fingerprint == fingerprint_arrays(split_arrays(ds.test, ds.y_test, ds.task, ds.single))
    other = load_dataset("digits", seed=3)
    assert fingerprint_arrays(split_arrays(other.test, other.y_test, other.task, True)) != split.fingerprint
    written = path.stat().st_mtime_ns
    split.share(tmp_path, "m")  # the same rows again: the content-addressed file is left as it was
    assert path.stat().st_mtime_ns == written


@pytest.mark.unit
@pytest.mark.parametrize(
    ("version", "data", "want"),
    [
        pytest.param(
            {"source": "digits", "seed": 0, "test_fraction": 0.2},
            {"source": "digits", "seed": 3, "test_fraction": 0.2},
            True,
            id="digits-other-seed",
        ),
        pytest.param(
            {"source": "digits", "seed": 0, "test_fraction": 0.2},
            {"source": "digits", "seed": 0, "test_fraction": 0.2},
            False,
            id="digits-same-seed",
        ),
        pytest.param(
            {"source": "t.csv", "source_sha256": "a", "seed": 0, "test_fraction": 0.2},
            {"source": "t.csv", "source_sha256": "b", "seed": 1, "test_fraction": 0.2},
            None,
            id="csv-other-content",
        ),
        pytest.param(
            {"source": "t.csv", "source_sha256": "a", "seed": 0, "test_fraction": 0.2},
            {"source": "t.csv", "source_sha256": "a", "seed": 0, "test_fraction": 0.3},
            True,
            id="csv-other-fraction",
        ),
        pytest.param(
            {"source": "digits", "seed": 0, "test_fraction": 0.2, "split": HashedSplit("s", 0.2).to_json()},
            {"source": "digits", "seed": 3, "test_fraction": 0.2, "split": HashedSplit("s", 0.2).to_json()},
            False,
            id="hashed-other-seed",
        ),
        pytest.param(
            {"source": "digits", "seed": 0, "test_fraction": 0.2, "split": HashedSplit("s", 0.2).to_json()},
            {"source": "digits", "seed": 0, "test_fraction": 0.2, "split": HashedSplit("t", 0.2).to_json()},
            True,
            id="hashed-other-salt",
        ),
        pytest.param({"source": "f.npz", "seed": 0}, {"source": "f.npz", "seed": 1}, None, id="file-own-split"),
        pytest.param({"source": "digits", "seed": 0}, None, None, id="unknown-data"),
    ],
)
def test_overlap_is_known_only_for_sources_split_by_seed(version, data, want):
    assert known_overlap(version, data) is want


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.unit
def test_two_trainings_keep_each_versions_split_and_record(two_trainings):
    _, root, before = two_trainings
    data = root / "data" / "digits"
    records = {v: json.loads((data / "versions" / f"{v}.json").read_text()) for v in (1, 2)}
    splits = {v: records[v]["test_split"] for v in (1, 2)}
    assert splits[1]["provenance"]["seed"] == 0 and splits[2]["provenance"]["seed"] == 3
    assert splits[1]["fingerprint"] != splits[2]["fingerprint"]
    names = sorted(p.name for p in (data / "splits").iterdir())
    assert names == sorted(f"{s['fingerprint']}.npz" for s in splits.values())
    assert sha(data / splits[1]["file"]) == before, "the later training left version 1's split as it was"
    assert fingerprint_npz(data / "test.npz") == splits[2]["fingerprint"], "test.npz: the newest training's"
    # The version's own trainserve.json says the same as its record on the data volume.
    assert read_metadata(root / "models" / "digits" / "2")["data"]["test_split"] == splits[2]


def run_eval(server, root, tmp_path, *args) -> tuple[int, dict]:
    report = tmp_path / "eval.json"
    code = main(
        [
            "eval",
            "--server",
            server.target,
            "--model",
            "digits",
            "--data-dir",
            str(root / "data"),
            "--report",
            str(report),
            "--min-accuracy",
            "0.1",
            *map(str, args),
        ]
    )
    return code, json.loads(report.read_text())


@pytest.mark.unit
@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("data", ["held-out", "digits"])
def test_each_version_is_evaluated_on_its_own_split(two_trainings, tmp_path, version, data):
    server, root, _ = two_trainings
    code, report = run_eval(server, root, tmp_path, "--version", version, "--data", data)
    record = json.loads((root / "data" / "digits" / "versions" / f"{version}.json").read_text())
    assert code == 0 and report["data_matches_version"] is True and report["passed"] is True
    assert report["data_check"]["data_fingerprint"] == record["test_split"]["fingerprint"]


@pytest.mark.unit
def test_another_versions_split_warns_and_rows_it_trained_on_refuse_every_gate(two_trainings, tmp_path, capsys):
    server, root, _ = two_trainings
    newest = root / "data" / "digits" / "test.npz"  # version 2's split (another salt): rows version 1 trained on
    code, report = run_eval(server, root, tmp_path, "--version", 1, "--data", newest)
    err = capsys.readouterr().err
    assert code == 1 and report["passed"] is False and report["data_matches_version"] is False
    assert report["data_check"]["overlaps_training"] is True and all(g["passed"] for g in report["gates"])
    assert "gates refused" in err.strip().splitlines()[-1] and "rows the version trained on" in err


@pytest.mark.unit
def test_held_out_needs_a_record_and_digits_refuses_a_version_trained_on_other_data(two_trainings, tmp_path, capsys):
    server, root, _ = two_trainings
    assert main(["eval", *target_flags(server, "digits"), "--data", "held-out", "--data-dir", str(tmp_path / "e")]) == 2
    assert "no held-out split recorded for model 'digits' version 2" in capsys.readouterr().err
    record = root / "data" / "digits" / "versions" / "2.json"
    other = tmp_path / "data" / "digits" / "versions" / "2.json"
    other.parent.mkdir(parents=True)
    body = json.loads(record.read_text())
    body["test_split"]["provenance"] = {"source": "mnist", "seed": 0}
    other.write_text(json.dumps(body))
    assert (
        main(["eval", *target_flags(server, "digits"), "--data", "digits", "--data-dir", str(tmp_path / "data")]) == 2
    )
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "was trained on 'mnist', not digits: expected --data held-out" in line
