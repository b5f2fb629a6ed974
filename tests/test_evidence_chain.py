"""The evidence chain through the CLI, as a user runs it: `trainserve eval` on a real serve-local, then
`trainserve promote` (or `report merge`, then promote). Each case once moved `stable` to a version never shown
to be as good as the one serving; each now ends in a one-line refusal with the config byte-identical.

Versions: the session's digits model (seed 0, version 1) and a training with --seed 3 --split-salt another
(version 2) into the same data directory (conftest.two_trainings): version 2's split holds rows version 1
trained on, and the reverse.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from conftest import install_version
from serving_fixtures import InProcessServer
from trainserve.cli import main
from trainserve.sources import load_dataset
from trainserve.splits import PROVENANCE_KEY, is_training_source, provenance

# serve-local on a thread of this process, real gRPC; two_trainings made once (conftest.py)
pytestmark = pytest.mark.xdist_group("two-trainings")


def eval_cli(server, root, report, *args) -> int:
    flags = ["--server", server.target, "--model", "digits", "--data-dir", str(root / "data"), "--report", str(report)]
    return main(["eval", *flags, "--min-accuracy", "0.1", *map(str, args)])


def rollout_config(path, base, candidate: int, stable: int | None = None):
    """The serving config as the rollout steps leave it: `candidate` staged, `stable` where one exists."""
    versions = " ".join(f"versions: {v}" for v in sorted({candidate, stable} - {None}))
    labels = f'version_labels {{ key: "candidate" value: {candidate} }}'
    if stable is not None:
        labels += f' version_labels {{ key: "stable" value: {stable} }}'
    path.write_text(
        f'model_config_list {{ config {{ name: "digits" base_path: "{base}" model_platform: "tensorflow" '
        f"model_version_policy {{ specific {{ {versions} }} }} {labels} }} }}\n"
    )
    return path


def split_rows(root, version: int) -> set[bytes]:
    """A version's held-out rows (image bytes and label), read from the split file its training wrote."""
    record = json.loads((root / "data" / "digits" / "versions" / f"{version}.json").read_text())["test_split"]
    with np.load(root / "data" / "digits" / record["file"]) as npz:
        return {x.tobytes() + bytes([y]) for x, y in zip(npz["x_test"], npz["y_test"])}


def refused(config, report, capsys, *fragments) -> None:
    """promote exits 2 with one error line naming the first fragment, config untouched."""
    before = config.read_bytes()
    capsys.readouterr()  # what eval said before
    assert main(["promote", "--config", str(config), "--report", str(report)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("trainserve promote: error:"), err
    for fragment in fragments:
        assert fragment in err, err
    assert config.read_bytes() == before


@pytest.mark.unit
def test_its_own_verified_split_promotes_and_other_files_under_that_number_do_not(two_trainings, tmp_path, capsys):
    """Case 7: a report vouches for the files it evaluated, by SHA-256; a version republished under the same number
    is refused. The positive control: the same report promotes the files it evaluated."""
    server, root, _ = two_trainings
    report = tmp_path / "r.json"
    assert eval_cli(server, root, report, "--version", 2) == 0  # --data defaults to its own held-out split
    assert json.loads(report.read_text())["evidence"]["kind"] == "own-split"
    republished = tmp_path / "models" / "digits"
    install_version(root / "models" / "digits" / "2", republished, 2)
    (republished / "2" / "assets.extra" / "trainserve.json").write_text('{"created": "later"}\n')
    refused(rollout_config(tmp_path / "other.config", republished, 2), report, capsys, "are not the ones it evaluated")
    config = rollout_config(tmp_path / "models.config", root / "models" / "digits", 2)
    assert main(["promote", "--config", str(config), "--report", str(report)]) == 0
    assert "stable -> 2" in capsys.readouterr().out


@pytest.mark.unit
def test_a_baseline_that_trained_on_the_rows_is_a_biased_comparison_and_refused(two_trainings, tmp_path, capsys):
    """Case 8: version 1 trained on most of version 2's split (another salt): compared there, it is flattered.
    The rows counted are exactly those of version 2's split that version 1's split does not hold."""
    server, root, _ = two_trainings
    report = tmp_path / "r.json"
    assert eval_cli(server, root, report, "--version", 2, "--compare-with", 1, "--not-worse=true") == 1
    body = json.loads(report.read_text())
    baseline = body["evidence"]["baseline"]
    assert baseline["rows"] == "overlapping" and body["passed"] is False
    held = {v: split_rows(root, v) for v in (1, 2)}
    assert baseline["rows_overlapping"] == len(held[2] - held[1]) > 0.6 * len(held[2])
    assert baseline["rows_checked"] == len(held[2]) == body["data"]["examples"]
    assert [g["passed"] for g in body["gates"] if g.get("kind")] == [False]
    config = rollout_config(tmp_path / "models.config", root / "models" / "digits", 2, stable=1)
    refused(config, report, capsys, "did not pass", "comparison is biased")


@pytest.mark.unit
def test_a_split_of_unknown_provenance_is_unverified_and_refused(two_trainings, tmp_path, capsys, caplog):
    """Case 3: --data digits without the version's record evaluates the seed-0 split (rows version 2 trained
    on): it says so, and promote refuses it."""
    server, root, _ = two_trainings
    report = tmp_path / "r.json"
    flags = (
        "--version",
        2,
        "--data",
        "digits",
        "--data-dir",
        tmp_path / "none",
        "--report",
        report,
        "--min-accuracy",
        0.5,
    )
    assert main(["eval", "--server", server.target, "--model", "digits", *map(str, flags)]) == 0
    assert "evaluating the seed-0 digits split" in caplog.text and "promote refuses it" in caplog.text
    evidence = json.loads(report.read_text())["evidence"]
    assert evidence["kind"] == "unverified" and evidence["version"]["files_sha256"] is None
    config = rollout_config(tmp_path / "models.config", root / "models" / "digits", 2)
    refused(config, report, capsys, "names no SHA-256")
    assert (
        main(["promote", "--config", str(config), "--report", str(report), "--override", "files", "--reason", "r"]) == 2
    )
    assert "its evidence is unverified (no record of model" in capsys.readouterr().err


@pytest.mark.unit
def test_a_split_edited_after_training_is_refused_or_unverified(two_trainings, tmp_path, capsys):
    """Case 3: rows appended to version 2's held-out split after training."""
    server, root, _ = two_trainings
    data = tmp_path / "data"
    shutil.copytree(root / "data", data)
    record = json.loads((data / "digits" / "versions" / "2.json").read_text())["test_split"]
    split = data / "digits" / record["file"]
    with np.load(split) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays["x_test"] = np.concatenate([arrays["x_test"], arrays["x_test"][:5]])
    arrays["y_test"] = np.concatenate([arrays["y_test"], arrays["y_test"][:5]])
    np.savez(split, **arrays)
    common = ["eval", "--server", server.target, "--model", "digits", "--version", "2", "--data-dir", str(data)]
    assert main([*common, "--data", "held-out"]) == 2
    assert "was changed after training" in capsys.readouterr().err
    report = tmp_path / "r.json"
    assert main([*common, "--data", str(split), "--report", str(report), "--min-accuracy", "0.1"]) == 0
    body = json.loads(report.read_text())
    assert body["data_check"]["overlaps_training"] is None and body["evidence"]["kind"] == "unverified"
    assert "edited after training" in body["data_check"]["note"]
    assert PROVENANCE_KEY in arrays


@pytest.mark.unit
def test_a_partial_eval_is_refused_and_limit_cannot_join_a_comparison(two_trainings, tmp_path, capsys):
    """Case 4."""
    server, root, _ = two_trainings
    assert eval_cli(server, root, tmp_path / "c.json", "--version", 2, "--compare-with", 1, "--limit", 5) == 2
    assert "expected no --shard, --limit or --compare-local" in capsys.readouterr().err
    report = tmp_path / "r.json"
    assert eval_cli(server, root, report, "--version", 2, "--limit", 5) == 0
    evidence = json.loads(report.read_text())["evidence"]
    assert (evidence["partial"], evidence["examples"]) == (True, 5) and evidence["split_examples"] > 5
    config = rollout_config(tmp_path / "models.config", root / "models" / "digits", 2)
    refused(config, report, capsys, f"evaluated 5 of {evidence['split_examples']} examples (--limit 5)")


@pytest.mark.integration
def test_merging_keeps_what_shards_refused_and_refuses_shards_of_other_data(two_trainings, tmp_path, capsys):
    """Case 5: version 1 on version 2's split (rows version 1 trained on), in two shards."""
    server, root, _ = two_trainings
    overlapping = root / "data" / "digits" / "test.npz"  # the newest training's split: version 2's
    shards = [tmp_path / f"s{i}.json" for i in range(2)]
    for i, shard in enumerate(shards):
        assert eval_cli(server, root, shard, "--version", 1, "--data", overlapping, "--shard", f"{i}/2") == 1
    merged = tmp_path / "merged.json"
    assert main(["report", "merge", *map(str, shards), "--output", str(merged)]) == 1
    body = json.loads(merged.read_text())
    assert body["passed"] is False and body["evidence"]["kind"] == "overlapping"
    config = rollout_config(tmp_path / "models.config", root / "models" / "digits", 1)
    refused(config, merged, capsys, "holds rows version 1 trained on")
    own = tmp_path / "own.json"
    assert eval_cli(server, root, own, "--version", 1, "--data", "held-out", "--shard", "1/2") == 0
    assert main(["report", "merge", str(shards[0]), str(own), "--output", str(tmp_path / "m2.json")]) == 2
    assert "expected shards of one evaluation" in capsys.readouterr().err


@pytest.mark.unit
@pytest.mark.parametrize("kind", ["csv", "folder"])
def test_the_very_file_or_folder_a_version_trained_on_is_recognised(tmp_path, kind):
    """Case 3: a CSV's record holds its SHA-256, an image folder's its fingerprint: eval on either is overlap."""
    from image_files import write_image_folder

    if kind == "csv":
        source, other = tmp_path / "train.csv", tmp_path / "other.csv"
        source.write_text("a,label\n1,0\n2,1\n")
        other.write_text("a,label\n1,0\n2,1\n3,1\n")
    else:
        source, other = write_image_folder(tmp_path / "train"), write_image_folder(tmp_path / "other", seed=9)
    recorded = provenance(str(source), seed=3, test_fraction=0.2)
    assert is_training_source(recorded, source) and not is_training_source(recorded, other)
    assert recorded["test_fraction"] == 0.2 and recorded["seed"] == 3


@pytest.fixture(scope="module")
def nan_server(tmp_path_factory):
    """serve-local with a classifier that answers NaN for every example whose centre pixel is above 128."""
    import tensorflow as tf

    class Broken(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 8, 8, 1], tf.uint8, name="images")])
        def serve(self, images):
            bad = tf.cast(images[:, 4, 4, 0], tf.float32) > 128.0
            uniform = tf.fill([tf.shape(images)[0], 10], 0.1)
            return {"probabilities": tf.where(bad[:, None], tf.fill(tf.shape(uniform), float("nan")), uniform)}

    root = tmp_path_factory.mktemp("nan")
    module = Broken()
    tf.saved_model.save(module, str(root / "digits" / "1"), signatures={"serving_default": module.serve})
    server = InProcessServer("--model_name=digits", f"--model_base_path={root / 'digits'}")
    server.wait_available("digits", 1)
    yield server
    assert server.stop() == 0


@pytest.mark.unit
def test_outputs_that_are_not_numbers_fail_the_eval_naming_how_many(nan_server, tmp_path, capsys):
    """Case 6: NaN taken as logits once scored accuracy by argmax (class 0); now the eval fails, nothing written."""
    report = tmp_path / "r.json"
    args = ["--data", "digits", "--data-dir", str(tmp_path), "--task", "classification"]
    assert main(["eval", "--server", nan_server.target, "--model", "digits", "--report", str(report), *args]) == 2
    x = load_dataset("digits").x_test
    expected = int(np.count_nonzero(x[:, 4, 4, 0] > 128))
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"version 1 answered NaN or infinite 'probabilities' for {expected} of {len(x)} examples" in line, line
    assert expected > 0 and not report.exists()
