"""docs/progressive-delivery.md's compose rollout, run as the page writes it, on a real Docker engine: its
console blocks in order (tests/tutorial_pages.py), `make` finding compose itself (this engine has no plugin:
the Makefile falls back to the shipped binary), the stand-in images (test_e2e_docker.py's fixtures) and a
stand-in Prometheus image (Debian's `prometheus` on the stand-in Debian). A retrain with the same seed is
promoted, one with another seed rolled back at the shadow step, and each command prints what the page shows.
Nothing is shortened for the test: the page's own settings (compose's demonstration budgets, Prometheus scraping
every 2 s, five epochs) make each block a test of under a minute."""

from __future__ import annotations

import dataclasses
import io
import os
import shutil
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_e2e_docker import compose, env  # noqa: F401 (a fixture)
from tutorial_pages import Block, missing_lines, outputs, read_blocks, run_script, script

from conftest import REPO, free_port

# A group of its own: the page's two trainings and two live rollouts take minutes, beside (not after) the other
# Docker tests, once the shared images are built (its worker waits on them).
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("docker-page")]

# Its own containers and volumes (a run from another checkout beside it has others), removed at the end.
PROJECT = f"trainserve-e2e-compose-page-{os.getpid()}"
PAGE = REPO / "docs" / "progressive-delivery.md"
SECTION = ("### A canary rollout on compose", "### A canary rollout on Kubernetes")
PROMETHEUS = "trainserve-standin/prometheus:debian"
WGET = "#!/bin/sh\n# the healthcheck's `wget -q -O /dev/null URL`\nexec python3 -c 'import sys, urllib.request; "
WGET += 'urllib.request.urlopen(sys.argv[-1], timeout=3)\' "$@"\n'


@pytest.fixture(scope="module")
def prometheus_image(docker_client) -> str:
    """The host's Prometheus (Debian's, linked against glibc only) on the stand-in Debian: no registry here."""
    binary = Path(shutil.which("prometheus") or pytest.skip("no prometheus on this machine"))
    context = io.BytesIO()
    dockerfile = (
        "FROM trainserve-standin/debian:bookworm\nCOPY prometheus /bin/prometheus\nCOPY wget /usr/local/bin/wget\n"
        'ENTRYPOINT ["/bin/prometheus"]\n'
    )
    with tarfile.open(fileobj=context, mode="w") as tar:
        for name, data, mode in (("Dockerfile", dockerfile.encode(), 0o644), ("wget", WGET.encode(), 0o755)):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
        tar.add(binary, "prometheus")
    context.seek(0)
    docker_client.images.build(fileobj=context, custom_context=True, tag=PROMETHEUS, rm=True)
    return PROMETHEUS


@pytest.fixture(scope="module")
def page_env(env, prometheus_image) -> dict:  # noqa: F811 (the imported fixture)
    """The reader's environment: compose.yaml and .env as they are (EPOCHS as the page sets it), free ports."""
    ports = ("GRPC_PORT", "REST_PORT", "PROXY_GRPC_PORT", "PROXY_REST_PORT", "PROMETHEUS_PORT")
    return {
        **{name: value for name, value in env.items() if name != "EPOCHS"},
        **{port: str(free_port()) for port in ports},
        "COMPOSE_PROJECT_NAME": PROJECT,
        "PROMETHEUS_IMAGE": prometheus_image,
        "VENV": str(Path(sys.executable).parent.parent),  # the Makefile's fallback: $(VENV)/bin/docker-compose
    }


def section_blocks(directory: Path) -> list[Block]:
    """The section's console blocks: marked skip for the tutorial test (they need Docker), run here."""
    text = PAGE.read_text()
    start, end = (text.index(heading) for heading in SECTION)
    (directory / "section.md").write_text(text[start:end])
    blocks = [b for b in read_blocks(directory / "section.md") if b.lang == "console" and Path(__file__).name in b.why]
    return [dataclasses.replace(block, mark=None) for block in blocks]


@dataclass
class Page:
    """The section's blocks, run one per test in the page's order on one compose project; a block runs only
    where every one before it passed (each starts from what the last left)."""

    env: dict
    blocks: list[Block]
    failed: str | None = None

    def run(self, number: int, name: str, timeout: float) -> str:
        if self.failed:
            pytest.skip(f"the page's {self.failed} failed, and this block starts where it ends")
        self.failed = name  # until it passes
        text, steps = script([self.blocks[number]], {})
        code, printed = run_script(text, REPO, self.env, timeout=timeout)
        by_step = outputs(printed)
        assert code == 0 and len(by_step) == len(steps), printed[-6000:]
        missing = {step.command: missing_lines(step.shown, by_step[n]) for n, step in enumerate(steps)}
        missing = {command: lines for command, lines in missing.items() if lines}
        assert not missing, f"not printed: {missing}\n" + "\n".join(by_step[n][-3000:] for n in range(len(steps)))
        self.failed = None
        return printed


@pytest.fixture(scope="module")
def page(docker_client, page_env, tmp_path_factory):
    blocks = section_blocks(tmp_path_factory.mktemp("compose-section"))
    assert len(blocks) == 4, [block.line for block in blocks]  # stable, traffic and v2, a good rollout, a bad one
    try:
        yield Page(page_env, blocks)
    finally:
        profiles = [f"--profile={p}" for p in ("train", "eval", "promote", "proxy", "monitoring", "load")]
        compose(page_env, *profiles, "down", "-v", "--remove-orphans", check=False)
    volumes = docker_client.volumes.list(filters={"label": f"com.docker.compose.project={PROJECT}"})
    assert not volumes, [v.name for v in volumes]


def test_a_stable_version_trained_served_and_promoted(page):
    printed = page.run(0, "stable version", timeout=240)
    assert "make: compose is" in printed


def test_traffic_and_a_second_version_trained(page):
    page.run(1, "traffic and second version", timeout=180)


def test_a_good_candidate_rolled_out_and_promoted(page):
    page.run(2, "good rollout", timeout=300)


def test_a_bad_candidate_rolled_back(page):
    page.run(3, "bad rollout", timeout=300)
