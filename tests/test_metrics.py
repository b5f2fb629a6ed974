"""serve-local's Prometheus page, read by prometheus_client's own parser (the reference reader of the text
exposition format) after clients asked for models with hostile names: the page still parses, a configured
model's name comes back exactly, and names no model has share one series however many there are."""

from __future__ import annotations

import random
import urllib.parse

import grpc
import pytest

from conftest import DIRECT, MONITORING, install_version
from serving_fixtures import predict_request, stubs
from trainserve.exposition import UNKNOWN_MODEL
from trainserve.model_server_config import render_model_config, single_model_config

pytestmark = pytest.mark.unit

REQUEST_COUNT = ":tensorflow:serving:request_count"
# Every character the format escapes in a label value, and some it does not need to.
HOSTILE = ['a"b', "back\\slash", "line\nfeed", "ünïcødé ☃", "", " ", "\\n", "} 1\n# TYPE x counter", '{model_name="x"}']
# A configured model whose name needs every escape: it is counted under its own name, which must parse back.
CONFIGURED = 'we"ird\\name\nwith ☃'


@pytest.fixture(name="server")
def server_fixture(serve_in_process, model_versions, tmp_path):
    """serve-local with metrics on, serving one version as `m` and as CONFIGURED."""
    base = tmp_path / "m"
    install_version(model_versions[0], base, 1)
    config = single_model_config("m", str(base))
    config.model_config_list.config.add(name=CONFIGURED, base_path=str(base), model_platform="tensorflow")
    models, monitoring = tmp_path / "models.config", tmp_path / "monitoring.config"
    models.write_text(render_model_config(config))
    monitoring.write_text(MONITORING)
    server = serve_in_process(f"--model_config_file={models}", f"--monitoring_config_file={monitoring}")
    server.wait_available("m", 1)
    return server


def scrape(server) -> dict:
    """The page as prometheus_client parses it: family name -> family (a malformed page raises)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = DIRECT.open(server.rest + "/monitoring/prometheus/metrics", timeout=10).read().decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def series(families: dict) -> int:
    return sum(len(family.samples) for family in families.values())


def request_count(families: dict, model: str, api: str, status: str, version: str | None = None) -> float:
    """Requests counted with these labels (of every version unless one is named)."""
    want = {"model_name": model, "api": api, "status": status}
    samples = families[REQUEST_COUNT].samples
    return sum(
        s.value
        for s in samples
        if {k: v for k, v in s.labels.items() if k != "version"} == want and version in (None, s.labels["version"])
    )


def ask_for(server, predict, model_service, name: str) -> None:
    """Predict, GetModelMetadata and GetModelStatus over gRPC, and status over REST, for a model named `name`."""
    from tensorflow_serving.apis import get_model_metadata_pb2, get_model_status_pb2

    metadata = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    metadata.model_spec.name = name
    status = get_model_status_pb2.GetModelStatusRequest()
    status.model_spec.name = name
    for call, request in [
        (predict.Predict, predict_request(name)),
        (predict.GetModelMetadata, metadata),
        (model_service.GetModelStatus, status),
    ]:
        with pytest.raises(grpc.RpcError) as err:
            call(request, timeout=30)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND, (name, err.value)
    assert server.get("/v1/models/" + urllib.parse.quote(name, safe=""))[0] == 404, name


def test_hostile_model_names_leave_a_page_the_reference_parser_reads(server):
    predict, model_service = stubs(server)
    for name in HOSTILE:
        ask_for(server, predict, model_service, name)
    predict.Predict(predict_request(CONFIGURED), timeout=30)
    predict.Predict(predict_request("m"), timeout=30)

    families = scrape(server)
    names = {s.labels["model_name"] for s in families[REQUEST_COUNT].samples}
    assert names == {"m", CONFIGURED, UNKNOWN_MODEL}, "unknown names are never labels; configured ones parse back"
    assert request_count(families, UNKNOWN_MODEL, "predict", "NOT_FOUND") == len(HOSTILE)
    assert request_count(families, UNKNOWN_MODEL, "metadata", "NOT_FOUND") == len(HOSTILE)
    assert request_count(families, CONFIGURED, "predict", "OK") == 1
    assert request_count(families, "m", "predict", "OK") == 1
    latency = families[":tensorflow:serving:request_latency"]
    assert {"m", CONFIGURED, UNKNOWN_MODEL} == {s.labels["model_name"] for s in latency.samples}
    available = families[":trainserve:serve_local:available_versions"].samples
    assert {s.labels["model_name"]: s.value for s in available} == {"m": 1, CONFIGURED: 1}
    assert families[REQUEST_COUNT].documentation == "The total number of requests."


def test_random_unknown_model_names_add_no_series(server):
    predict, model_service = stubs(server)
    ask_for(server, predict, model_service, "first unknown")
    before = scrape(server)
    rng = random.Random(30)
    alphabet = 'ab"\\\n\r\t {}=,#☃ü' + "".join(map(chr, range(0x4E00, 0x4E10)))
    for _ in range(200):
        name = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 24)))
        with pytest.raises(grpc.RpcError) as err:
            predict.Predict(predict_request(name), timeout=30)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND, (name, err.value)

    after = scrape(server)
    assert series(after) == series(before), "200 unknown names: the same series, only their counts grew"
    assert request_count(after, UNKNOWN_MODEL, "predict", "NOT_FOUND") == 1 + 200


def test_rest_predict_failures_are_counted_like_grpc_ones(server):
    """REST resolves the version and converts the JSON inside the request's bookkeeping, as gRPC does: an unknown
    model and a malformed body are each counted by their status."""
    before = scrape(server)
    assert server.post("/v1/models/nope:predict", {"instances": [[1]]})[0] == 404
    assert server.post("/v1/models/m:predict", {"instances": [{"no_such_input": 1}]})[0] == 400
    after = scrape(server)
    for model, status in ((UNKNOWN_MODEL, "NOT_FOUND"), ("m", "INVALID_ARGUMENT")):
        grew = request_count(after, model, "predict", status) - request_count(before, model, "predict", status)
        assert grew == 1, (model, status)


def test_requests_are_counted_by_the_version_that_answered(serve_in_process, model_versions, tmp_path):
    """Two versions side by side, asked by number and by label: each version's requests and latency are its own
    series (TF Serving has no version label); a version that does not exist is counted with none."""
    from serving_fixtures import serve_every_version

    base = tmp_path / "m"
    for version in (1, 2):
        install_version(model_versions[version - 1], base, version)
    monitoring = tmp_path / "monitoring.config"
    monitoring.write_text(MONITORING)
    server = serve_every_version(
        tmp_path / "models.config",
        "m",
        base,
        (1, 2),
        {"stable": 1, "canary": 2},
        "--allow_version_labels_for_unavailable_models",
        f"--monitoring_config_file={monitoring}",
    )
    try:
        predict, _ = stubs(server)
        for request in [predict_request(version=1), predict_request(label="stable"), predict_request(label="canary")]:
            predict.Predict(request, timeout=30)
        with pytest.raises(grpc.RpcError) as err:
            predict.Predict(predict_request(version=7), timeout=30)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        families = scrape(server)
    finally:
        assert server.stop() == 0
    assert request_count(families, "m", "predict", "OK", version="1") == 2
    assert request_count(families, "m", "predict", "OK", version="2") == 1
    assert request_count(families, "m", "predict", "NOT_FOUND", version="") == 1
    latency = families[":tensorflow:serving:request_latency"].samples
    counts = {s.labels["version"]: s.value for s in latency if s.name.endswith("_count")}
    assert counts == {"1": 2, "2": 1, "": 1}
    states = families[":trainserve:serve_local:version_state"].samples
    assert {(s.labels["version"], s.labels["state"], s.labels["error_code"], s.value) for s in states} == {
        ("1", "AVAILABLE", "OK", 1),
        ("2", "AVAILABLE", "OK", 1),
    }


def test_version_state_leaves_out_versions_unloaded_on_purpose():
    """A failed load stays on the page (END, UNKNOWN); a version unloaded on purpose does not, or every version
    ever published would add a series."""
    from types import SimpleNamespace

    from trainserve.serving.manager import State, VersionState
    from trainserve.serving.metrics import version_state_lines

    versions = {1: VersionState(1, State.END), 2: VersionState(2, State.END, "load failed"), 3: VersionState(3)}
    versions[3].state = State.AVAILABLE
    lines = version_state_lines(SimpleNamespace(models={"m": SimpleNamespace(versions=versions)}))
    series = [line for line in lines if not line.startswith("#")]
    assert series == [
        ':trainserve:serve_local:version_state{model_name="m",version="2",state="END",error_code="UNKNOWN"} 1',
        ':trainserve:serve_local:version_state{model_name="m",version="3",state="AVAILABLE",error_code="OK"} 1',
    ]
