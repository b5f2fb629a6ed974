"""live-eval on real traffic: serve-local answers two versions over gRPC and captures every call, the client sends
its x-request-id, and the labels file covers a known subset (some examples unlabelled, some labelled twice, one id
no request had). Each version's accuracy equals the count made here from the capture's own records and the labels."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import install_version
from trainserve.cli import main
from trainserve.model_server_config import render_model_config, single_model_config
from trainserve.protos import prediction_log_pb2
from trainserve.tfrecord import iter_records

pytestmark = pytest.mark.integration


def serve_two_versions_capturing(model_versions, root, serve_in_process):
    for version in (1, 2):
        install_version(model_versions[version - 1], root / "m", version)
    config = single_model_config("m", str(root / "m"))
    entry = config.model_config_list.config[0]
    entry.model_version_policy.all.SetInParent()
    entry.logging_config.sampling_config.sampling_rate = 1.0
    entry.logging_config.log_collector_config.filename_prefix = str(root / "captures" / "m")
    (root / "models.config").write_text(render_model_config(config))
    server = serve_in_process(f"--model_config_file={root / 'models.config'}")
    for version in (1, 2):
        server.wait_available("m", version)
    return server


def recorded_answers(directory) -> dict:
    """(version, request id, row) -> the class the recorded answer gave, the first answer of each; read here from
    the PredictionLog records themselves."""
    from trainserve.tensors import from_tensor_proto

    answers = {}
    for path in sorted(directory.glob("*.tfrecord")):
        with open(path, "rb") as stream:
            for raw in iter_records(stream):
                entry = prediction_log_pb2.PredictionLog.FromString(raw)
                version = entry.predict_log.response.model_spec.version.value
                scores = from_tensor_proto(entry.predict_log.response.outputs["probabilities"])
                for row, predicted in enumerate(scores.argmax(axis=1)):
                    answers.setdefault((version, entry.log_metadata.request_origin, row), int(predicted))
    return answers


def test_live_accuracy_per_version_equals_the_count_from_the_recorded_answers(
    model_versions, tmp_path, serve_in_process, capsys
):
    from serving_fixtures import predict_request, stubs

    server = serve_two_versions_capturing(model_versions, tmp_path, serve_in_process)
    predict, _ = stubs(server)
    rng = np.random.default_rng(3)
    sent = []  # (request id, versions it went to)
    for i in range(40):
        versions = (1, 2) if i % 2 == 0 else ((1,) if i % 4 == 1 else (2,))  # every other one shadowed to both
        images = rng.integers(0, 256, (3, 8, 8, 1), dtype=np.uint8)
        for version in versions:
            predict.Predict(
                predict_request("m", images, version=version), metadata=[("x-request-id", f"r{i}")], timeout=30
            )
        sent.append((f"r{i}", versions))
    retry = predict_request("m", rng.integers(0, 256, (3, 8, 8, 1), dtype=np.uint8), version=1)
    predict.Predict(retry, metadata=[("x-request-id", "r1")], timeout=30)  # a retry under an id already answered
    assert server.stop() == 0  # drains the capture

    truth = {(rid, row): int(rng.integers(10)) for rid, _ in sent for row in range(3) if (int(rid[1:]) + row) % 4}
    rows = [f"{rid},{row},{label}" for (rid, row), label in truth.items()]
    rows += rows[:5]  # labelled twice
    rows.append("nobody,0,3")  # an id no request had
    (tmp_path / "labels.csv").write_text("request_id,request_row,label\n" + "\n".join(rows) + "\n")
    report_path = tmp_path / "live.json"
    code = main(
        [
            "live-eval",
            str(tmp_path / "captures"),
            "--model",
            "m",
            "--data-dir",
            str(tmp_path),
            "--labels",
            str(tmp_path / "labels.csv"),
            "--max-drop",
            "1",
            "--report",
            str(report_path),
        ]
    )
    assert code == 0, capsys.readouterr().err
    report = json.loads(report_path.read_text())

    answers = recorded_answers(tmp_path / "captures")
    for section in report["versions"]:
        v = section["version"]
        labelled = {k: label for k, label in truth.items() if (v, *k) in answers}
        right = sum(answers[(v, *k)] == label for k, label in labelled.items())
        answered = sum(1 for key in answers if key[0] == v)
        retried = 3 if v == 1 else 0
        assert (section["joined"], section["overall"]["correct"]) == (len(labelled), right)
        assert section["captured"] == answered + retried
        assert section["duplicates"] == sum(("r1", row) in truth for row in range(3)) * (v == 1)
        assert section["unlabelled"] == section["captured"] - len(labelled) - section["duplicates"]
    shadowed = {(rid, row) for rid, versions in sent if len(versions) == 2 for row in range(3)}
    assert report["pairs"][0]["examples"] == len(shadowed & truth.keys())
    assert report["labels"]["duplicate_rows"] == 5 and report["join"]["labelled_not_captured"] == 1
    assert report["gates"][0]["paired"] and report["gates"][0]["method"].startswith(
        f"paired on {len(shadowed & truth.keys())}"
    )
