"""The shared TF Serving client (trainserve.client) against serve-local on a thread of this process: labels resolve
to the version behind them through GetModelMetadata, as on TF Serving, whose GetModelStatus ignores a label (and
so does serve-local's); `load --label` and `eval --label` measure that version; pins are sent even for version 0;
the waits fail with one line that says what was expected."""

from __future__ import annotations

import json

import grpc
import numpy as np
import pytest

from conftest import QUICK_SWEEP, install_version
from trainserve.cli import main
from trainserve.client import ServingClient, Target, open_channel
from trainserve.errors import TrainserveError
from trainserve.protos import get_model_status_pb2, model_service_pb2_grpc, prediction_service_pb2_grpc
from trainserve.tls import ClientTls

pytestmark = pytest.mark.unit  # one in-process server; the clients are this process's own
IMAGES = np.random.default_rng(3).integers(0, 256, (4, 8, 8, 1), dtype=np.uint8)


@pytest.fixture(scope="module")
def labelled(model_versions, tmp_path_factory):
    """Model m with versions 1 and 2 both served, `stable` on the OLDER one (a candidate waiting to be promoted)."""
    from serving_fixtures import serve_every_version

    root = tmp_path_factory.mktemp("labelled")
    for version in (1, 2):
        install_version(model_versions[version - 1], root / "m", version)
    flag = "--allow_version_labels_for_unavailable_models"  # the label is read before its version loads
    server = serve_every_version(root / "models.config", "m", root / "m", (1, 2), {"stable": 1}, flag)
    yield server
    assert server.stop() == 0


def status_versions(server, label: str | None = None) -> list[int]:
    """The versions gRPC GetModelStatus lists for model m, asked with `label` in the ModelSpec."""
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "m"
    if label is not None:
        request.model_spec.version_label = label
    with grpc.insecure_channel(server.target) as channel:
        response = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(request, timeout=30)
    return [s.version for s in response.model_version_status]


@pytest.mark.parametrize("label", ["stable", "no_such_label"])
def test_get_model_status_ignores_the_label_as_tf_serving_does(labelled, label):
    """get_model_status_impl.cc reads only the ModelSpec's name and version: every version, whatever the label."""
    assert status_versions(labelled, label) == status_versions(labelled) == [1, 2]
    code, body = labelled.get(f"/v1/models/m/labels/{label}")
    assert code == 200 and [int(s["version"]) for s in body["model_version_status"]] == [1, 2]
    assert labelled.get("/v1/models/m/labels/stable/metadata")[1]["model_spec"]["version"] == "1", "metadata resolves"


def test_an_unknown_label_is_invalid_argument_as_on_tf_serving(labelled):
    """ServerCore::GetModelVersionForLabel: an unknown label is the request's fault (INVALID_ARGUMENT, HTTP 400),
    not a missing servable (NOT_FOUND)."""
    from serving_fixtures import predict_request

    with grpc.insecure_channel(labelled.target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as error:
            stub.Predict(predict_request(images=IMAGES, label="nope"), timeout=30)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details() == "Unrecognized servable version label: nope"
    code, body = labelled.post("/v1/models/m/labels/nope:predict", {"instances": IMAGES.tolist()})
    assert code == 400 and body["error"] == "Unrecognized servable version label: nope"


class Recorder(grpc.UnaryUnaryClientInterceptor):
    """Every RPC the client sends: (method, the request's ModelSpec)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def intercept_unary_unary(self, continuation, details, request):
        self.calls.append((details.method.rpartition("/")[2], request.model_spec))
        return continuation(details, request)


def recording_client(server) -> tuple[ServingClient, Recorder]:
    recorder = Recorder()
    channel = grpc.intercept_channel(open_channel(server.target), recorder)
    return ServingClient(server.target, channel=channel), recorder


def test_a_label_resolves_through_get_model_metadata_and_predict_pins_its_version(labelled, model_versions):
    from serving_fixtures import expected

    client, recorder = recording_client(labelled)
    with client:
        target = Target("m", label="stable")
        version = client.wait_until_available(target, 60)
        answer = client.predict(target, {"images": IMAGES}, ["probabilities"], version, retries=0)
    assert version == 1, "the version behind `stable`, not the newest"
    (method, spec), (predicted, pinned) = recorder.calls
    assert (method, spec.version_label, spec.HasField("version")) == ("GetModelMetadata", "stable", False)
    assert predicted == "Predict" and pinned.version.value == 1 and not pinned.version_label, "pinned, not labelled"
    want = expected(model_versions[0], IMAGES)["probabilities"]
    np.testing.assert_allclose(answer.outputs["probabilities"], want, atol=1e-6)
    assert answer.version == 1


def test_version_zero_is_a_pin_not_the_newest(labelled):
    """A set version, even 0, asks for exactly that version (ServerCore::ServableRequestFromModelSpec)."""
    with ServingClient(labelled.target) as client:
        with pytest.raises(TrainserveError, match=r"model 'm' version 0 not AVAILABLE on .* within --wait 0 s"):
            client.wait_until_available(Target("m", version=0), 0)
        assert client.wait_until_available(Target("m"), 0) == 2, "no version: the newest AVAILABLE"


def test_an_unknown_label_or_model_fails_at_once_and_a_label_wait_names_what_it_saw(labelled):
    with ServingClient(labelled.target) as client:
        with pytest.raises(TrainserveError, match="label 'nope' of model 'm' not found on"):
            client.wait_until_available(Target("m", label="nope"), 600)
        with pytest.raises(TrainserveError, match="model 'other' not found on"):
            client.wait_until_available(Target("other"), 600)
        assert client.label_version("m", "nope") is None
        moved = "label 'stable' of model m resolves to version 1 .* expected version 2"
        with pytest.raises(TrainserveError, match=moved):
            client.wait_label("m", "stable", 2, 0)
        client.wait_label("m", "stable", 1, 0)
        client.wait_available("m", 2, 0)


def test_load_with_a_label_measures_the_version_behind_it(labelled, tmp_path):
    """`stable` is on version 1 and version 2 is newer: the sweep must pin version 1 (it used to take the newest
    AVAILABLE from GetModelStatus, which on TF Serving ignores the label)."""
    assert status_versions(labelled, "stable") == [1, 2], "the server answers status as TF Serving does"
    report = tmp_path / "load.json"
    target = ["--server", labelled.target, "--model", "m", "--label", "stable"]
    code = main(["load", *target, "--batch-sizes", "1", *QUICK_SWEEP, "--report", str(report)])
    assert code == 0
    written = json.loads(report.read_text())
    assert (written["version"], written["label"]) == (1, "stable")
    assert sum(p["error_count"] for p in written["points"]) == 0, "every pinned request was answered"


def test_eval_with_a_label_evaluates_the_version_behind_it(labelled, tmp_path):
    data = tmp_path / "test.npz"
    np.savez(data, x_test=IMAGES, y_test=np.arange(len(IMAGES)))
    report = tmp_path / "eval.json"
    target = ["--server", labelled.target, "--model", "m", "--label", "stable"]
    code = main(["eval", *target, "--data", str(data), "--report", str(report)])
    written = json.loads(report.read_text())
    assert code == 0 and (written["version"], written["label"]) == (1, "stable")


def test_an_unreadable_ca_file_is_one_line_before_any_request(tmp_path):
    with pytest.raises(TrainserveError, match=r"--tls-ca .*missing.pem cannot be read .*: expected a PEM file"):
        ServingClient("127.0.0.1:1", tls=ClientTls(tmp_path / "missing.pem"))
