"""`trainserve rollout` against the serve-cpu image on the Docker engine: the image serves model m from the
models.config on its mounted rollout directory (polled every second, as compose's `rollout` volume), the capture
proxy follows the routing file in front of it, Debian's `prometheus` scrapes both with compose's scrape config and
the repository's rules, and clients call `stable` through the proxy all along. A good candidate goes
shadow -> 5 % -> 25 % -> 100 % and is promoted: the server's own answers to `stable` then name it, and no client was
answered by a version the routing file did not name. The failing and flipping candidates are judged on serve-local
(tests/test_rollout_controller_live.py): one rollout here, as each Docker test costs CI time."""

from __future__ import annotations

import pytest
from reports import compared_with, eval_report, write
from rollout_live import Applied
from test_e2e_monitoring_docker import Container
from test_rollout_controller_live import Clients, roll_out

from conftest import free_port, install_version
from prometheus_server import Prometheus
from serving_fixtures import NO_LATENCY_SHED, predict_request, stubs
from trainserve.proxy.config import ProxyConfig
from trainserve.proxy.routing import read_routing
from trainserve.proxy.server import Proxy
from trainserve.rollout.config import CandidateConfig, PromoteConfig
from trainserve.rollout.config_file import history_path, read_config
from trainserve.rollout.history import read_history
from trainserve.rollout.labels import Rollout
from trainserve.rollout.steps import promote, stage_candidate

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("docker")]  # one worker drives the engine


class ServeCpu(Container):
    """The serve-cpu container, its gRPC and REST ports published on loopback."""

    def __init__(self, container, grpc_port: int, rest_port: int):
        super().__init__(container, rest_port)
        self.target = f"127.0.0.1:{grpc_port}"


def start_serve_cpu(docker_client, image: str, models, rollout) -> ServeCpu:
    """The image as compose runs it for a rollout (read-only, ROLLOUT_CONFIG_FILE on the rollout directory), the
    config polled every second. The model directory is mounted at its own host path: the config's base_path then
    names the same versions for the server and for the controller, which checks the reports against the files."""
    for path in [*(p for d in (models, rollout) for p in (d, *d.rglob("*")))]:  # the container's user reads them
        path.chmod(0o755 if path.is_dir() else 0o644)
    grpc_port, rest_port = free_port(), free_port()
    container = docker_client.containers.run(
        image,
        detach=True,
        read_only=True,
        tmpfs={"/tmp": ""},
        environment={"ROLLOUT_CONFIG_FILE": "/rollout/models.config", "MODEL_CONFIG_POLL_WAIT_SECONDS": "1"},
        ports={"8500/tcp": ("127.0.0.1", grpc_port), "8501/tcp": ("127.0.0.1", rest_port)},
        volumes={str(models): {"bind": str(models), "mode": "ro"}, str(rollout): {"bind": "/rollout", "mode": "ro"}},
    )
    return ServeCpu(container, grpc_port, rest_port)


def test_a_good_candidate_is_rolled_out_step_by_step_on_the_serve_cpu_image(
    docker_client, docker_images, model_versions, tmp_path, capsys
):
    base = tmp_path / "models" / "m"
    for version in (1, 2):  # 2: the same weights, so no answer flips
        install_version(model_versions[0], base, version)
    config = tmp_path / "rollout" / "models.config"
    config.parent.mkdir()
    stage_candidate(CandidateConfig(config, "m", str(base), 1, "unused:1", 1), Applied())
    promote(PromoteConfig(config, write(compared_with(eval_report(base / "1"), None), tmp_path / "report-1.json")))
    server = start_serve_cpu(docker_client, docker_images["serve-cpu"], tmp_path / "models", config.parent)
    routing = config.parent / "routing.json"
    proxy = prometheus = clients = None
    try:
        server.wait_available("m", 1)
        proxy = Proxy(
            ProxyConfig(
                upstream=server.target,
                upstream_rest=server.rest.removeprefix("http://"),
                port=0,
                rest_port=0,
                filename_prefix=str(tmp_path / "captures" / "c"),
                sampling_rate=0.0,
                routing_file=routing,
                routing_poll_seconds=0.2,
                **NO_LATENCY_SHED,
            )
        )
        prometheus = Prometheus(
            tmp_path,
            server.rest.removeprefix("http://"),
            "prometheus-compose.yml",
            proxy=f"127.0.0.1:{proxy.rest_port}",
        )
        prometheus.wait_scraped(2)
        clients = Clients(proxy)

        code, out = roll_out(config, base, server, prometheus, 2), capsys.readouterr().out
        assert code == 0 and out.startswith("promoted: model m: stable -> 2, previous -> 1"), (out, server.log())
        clients.close()
        predict, _ = stubs(server)  # the server itself, not through the proxy
        assert predict.Predict(predict_request(label="stable"), timeout=30).model_spec.version.value == 2
    finally:
        if clients is not None:
            clients.close()
        if prometheus is not None:
            prometheus.stop()
        if proxy is not None:
            proxy.stop(5)
        server.stop()

    events = [e for e in read_history(history_path(config)) if e.get("action") == "rollout"]
    assert [e["step"] for e in events if e["event"] == "step"] == [0, 1, 2], events
    assert Rollout.of(read_config(config).model_config_list.config[0]).stable == 2
    assert read_routing(routing).route("m") is None
    assert not clients.errors, clients.errors[:5]
    strays = [(v, named) for v, named, _ in clients.answers if v not in {1, 2} and v not in named]
    assert not strays, strays[:5]
    assert any(v == 2 and named == {2} for v, named, _ in clients.answers), "no client got the canary's answer"
    assert clients.answers[-1][0] == 2, clients.answers[-1]  # stable, through the proxy, once promoted
