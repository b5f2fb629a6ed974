"""The site of the live rollout tests: model m served by serve-local (in this process) polling the config the
controller rewrites, a proxy following the routing file the controller writes, and a real Prometheus scraping both
with the repository's scrape config and rules; and a candidate staged on it with its eval report, as `trainserve
candidate` and `trainserve eval --compare-with` leave one."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from reports import compared_with, eval_report, write

from conftest import MONITORING, install_version
from prometheus_server import Prometheus
from serving_fixtures import NO_LATENCY_SHED, InProcessServer
from trainserve.client import ServingClient
from trainserve.proxy.config import ProxyConfig
from trainserve.proxy.server import Proxy
from trainserve.rollout.config import CandidateConfig, PromoteConfig
from trainserve.rollout.config_file import read_config
from trainserve.rollout.labels import Rollout
from trainserve.rollout.steps import promote, stage_candidate


class Applied:
    """A server that has applied every change at once: for the config written before serve-local starts."""

    def wait_available(self, model, version, wait):
        pass

    def wait_label(self, model, label, version, wait):
        pass


@dataclass(frozen=True)
class Site:
    config: Path  # the ModelServerConfig serve-local polls every second
    base: Path  # model m's versions
    server: InProcessServer
    proxy: Proxy
    prometheus: Prometheus

    @property
    def routing(self) -> Path:
        return self.config.parent / "routing.json"


@contextlib.contextmanager
def live_site(root: Path, versions: dict[int, Path], *server_flags: str) -> Iterator[Site]:
    """Model m's `versions` (number: SavedModel) installed, the first one stable (promoted as a first rollout is),
    served (with `server_flags` too), proxied and scraped every second; stopped on leaving (serve-local must exit
    0)."""
    base = root / "models" / "m"
    for version, template in versions.items():
        install_version(template, base, version)
    first = min(versions)
    config = root / "rollout" / "models.config"
    config.parent.mkdir()
    stage_candidate(CandidateConfig(config, "m", str(base), first, "unused:1", 1), Applied())
    promote(PromoteConfig(config, write(compared_with(eval_report(base / str(first)), None), root / "report-1.json")))
    (root / "monitoring.config").write_text(MONITORING)  # serve-local's own page, which Prometheus scrapes too
    server = InProcessServer(
        f"--monitoring_config_file={root / 'monitoring.config'}",
        f"--model_config_file={config}",
        "--model_config_file_poll_wait_seconds=1",
        "--allow_version_labels_for_unavailable_models",
        *server_flags,
    )
    proxy = prometheus = None
    try:
        server.wait_available("m", first)
        proxy = Proxy(
            ProxyConfig(
                upstream=server.target,
                upstream_rest=f"127.0.0.1:{server.rest_port}",
                port=0,
                rest_port=0,
                filename_prefix=str(root / "captures" / "c"),
                sampling_rate=0.0,
                routing_file=config.parent / "routing.json",
                routing_poll_seconds=0.2,
                **NO_LATENCY_SHED,
            )
        )
        # The repository's scrape config: serve-local's page and the proxy's.
        prometheus = Prometheus(root, f"127.0.0.1:{server.rest_port}", proxy=f"127.0.0.1:{proxy.rest_port}")
        prometheus.wait_scraped(2)
        yield Site(config, base, server, proxy, prometheus)
    finally:
        if prometheus is not None:
            prometheus.stop()
        if proxy is not None:
            proxy.stop(5)
        assert server.stop() == 0


def staged(config: Path, base: Path, server: InProcessServer, version: int) -> Path:
    """`version` staged on the real server (loaded, labelled `candidate`); returns its eval report against stable,
    made on this server."""
    stage_candidate(CandidateConfig(config, "m", None, version, server.target, 60), ServingClient(server.target))
    stable = Rollout.of(read_config(config).model_config_list.config[0]).stable
    document = compared_with(eval_report(base / str(version)), stable) | {"server": server.target}
    return write(document, config.parent / f"report-{version}.json")
