"""`trainserve proxy` in the eval image, in front of the serving image, on a real Docker engine: a client gets the
same answers through it, over gRPC and REST, and `docker stop` leaves the sampled calls written on the volume."""

from __future__ import annotations

import json
import uuid

import grpc
import numpy as np
import pytest
from test_e2e_docker import smoke_model, urllib_request, wait_until  # noqa: F401  (smoke_model: a fixture)

from conftest import DIRECT, free_port
from conftest import TF_VERSION_ENV as TF_VERSION
from trainserve.protos import predict_pb2, prediction_log_pb2
from trainserve.protos.prediction_service_pb2_grpc import PredictionServiceStub
from trainserve.tensors import from_tensor_proto, to_tensor_proto
from trainserve.tfrecord import iter_records

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("docker")]  # one worker drives the engine


def rest_predict(port: int) -> dict:
    request = urllib_request(f"http://127.0.0.1:{port}/v1/models/digits:predict", {"instances": [1.0, 2.0]})
    with DIRECT.open(request, timeout=10) as response:
        return json.loads(response.read())


def grpc_predict(port: int) -> predict_pb2.PredictResponse:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "digits"
    to_tensor_proto(np.array([1.0, 2.0], np.float32), into=request.inputs["x"])
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return PredictionServiceStub(channel).Predict(request, timeout=30, metadata=[("x-request-id", "e2e-1")])


def test_capture_in_front_of_the_serving_image(docker_client, docker_images, smoke_model, tmp_path):  # noqa: F811
    captures = tmp_path / "captures"
    captures.mkdir()
    captures.chmod(0o777)  # the eval image's user (10001) writes here
    network = docker_client.networks.create(f"trainserve-proxy-{uuid.uuid4().hex[:8]}")
    serve_rest, proxy_grpc, proxy_rest = free_port(), free_port(), free_port()
    started = []
    try:
        serve = docker_client.containers.run(
            f"trainserve/serve-cpu:{TF_VERSION}",
            detach=True,
            read_only=True,
            tmpfs={"/tmp": ""},
            network=network.name,
            name=f"serve-{network.name}",
            volumes={str(smoke_model): {"bind": "/models", "mode": "ro"}},
            ports={"8501/tcp": ("127.0.0.1", serve_rest)},
        )
        started.append(serve)
        wait_until(lambda: (serve.reload() or serve.attrs["State"]["Health"]["Status"]) == "healthy", "healthy", 90)
        proxy = docker_client.containers.run(
            f"trainserve/eval:{TF_VERSION}",
            entrypoint=["trainserve", "proxy"],
            detach=True,
            read_only=True,
            network=network.name,
            environment={
                "TRAINSERVE_UPSTREAM": f"{serve.name}:8500",
                "TRAINSERVE_UPSTREAM_REST": f"{serve.name}:8501",
                "TRAINSERVE_FILENAME_PREFIX": "/captures/digits",
            },
            volumes={str(captures): {"bind": "/captures", "mode": "rw"}},
            ports={"8500/tcp": ("127.0.0.1", proxy_grpc), "8501/tcp": ("127.0.0.1", proxy_rest)},
        )
        started.append(proxy)
        wait_until(lambda: b"proxy: gRPC on 8500" in proxy.logs(), "the proxy listening", 60)
        assert rest_predict(proxy_rest) == rest_predict(serve_rest) == {"predictions": [3.0, 5.0]}
        answer = grpc_predict(proxy_grpc)
        assert from_tensor_proto(answer.outputs["y"]).tolist() == [3.0, 5.0]
        proxy.stop(timeout=30)  # SIGTERM: the queued record is written, exit 0
        assert proxy.wait(timeout=60)["StatusCode"] == 0, proxy.logs().decode()
    finally:
        for container in started:
            container.remove(force=True)
        network.remove()
    (path,) = captures.glob("digits-*.tfrecord")
    with open(path, "rb") as stream:
        (record,) = list(iter_records(stream))  # the gRPC Predict; REST is forwarded, not written
    log = prediction_log_pb2.PredictionLog.FromString(record)
    assert log.log_metadata.request_origin == "e2e-1" and log.log_metadata.model_spec.version.value == 1
    assert log.predict_log.response == answer
