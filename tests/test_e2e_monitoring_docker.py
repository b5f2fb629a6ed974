"""The rules and the dashboard against a real Prometheus scraping the serve-cpu image on the Docker engine, with
compose's scrape config (monitoring/prometheus-compose.yml, job serve-cpu): a mounted models.config serves two
versions (stable and canary) and a third whose load fails; the image turns batching and the metrics on. Every
recording rule, alert expression and dashboard query, the dashboard's model variable and the versions' states are
checked by one test (each Docker test costs CI time), which names every failing expression. The same checks run
against serve-local in tests/test_monitoring_prometheus.py."""

from __future__ import annotations

import contextlib

import pytest

from conftest import Server, free_port
from prometheus_server import every_check, watched_model, watching

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("docker")]  # one worker drives the engine


class Container(Server):
    """serve-cpu in a container, its REST port published on loopback: the tests' waits and requests work on it."""

    def __init__(self, container, rest_port: int):
        self.container = container
        self.rest = f"http://127.0.0.1:{rest_port}"

    def ended(self) -> str | None:
        self.container.reload()
        state = self.container.attrs["State"]
        return None if state["Status"] in ("created", "running") else f"{state['Status']} ({state['ExitCode']})"

    def log(self) -> str:
        return self.container.logs().decode(errors="replace")

    def stop(self) -> None:
        import docker.errors

        with contextlib.suppress(docker.errors.NotFound):  # removed already (a wait that timed out stops it)
            self.container.remove(force=True)


@pytest.fixture(scope="module", name="prometheus")
def prometheus_fixture(docker_client, docker_images, model_versions, tmp_path_factory):
    root = tmp_path_factory.mktemp("monitoring-docker")
    models_config = watched_model(root, model_versions, "/models/m")
    for path in [root, *root.rglob("*")]:  # the container's user (10001) reads them
        path.chmod(0o755 if path.is_dir() else 0o644)
    rest = free_port()
    server = Container(
        docker_client.containers.run(
            docker_images["serve-cpu"],
            detach=True,
            read_only=True,
            tmpfs={"/tmp": ""},
            ports={"8501/tcp": ("127.0.0.1", rest)},
            volumes={
                str(root / "models"): {"bind": "/models", "mode": "ro"},
                str(models_config): {"bind": "/etc/trainserve/models.config", "mode": "ro"},
            },
        ),
        rest,
    )
    try:
        with watching(server, root, f"127.0.0.1:{rest}", "prometheus-compose.yml") as prometheus:
            yield prometheus
    finally:
        server.stop()


def test_every_rule_alert_and_dashboard_query_returns_labelled_series_from_serve_cpu(prometheus):
    failures = []
    for what, check in every_check():
        try:
            check(prometheus)
        except AssertionError as err:
            failures.append(f"{what}: {str(err).splitlines()[0]}")
    assert not failures, f"{len(failures)} of {len(every_check())} checks failed:\n" + "\n".join(failures)
