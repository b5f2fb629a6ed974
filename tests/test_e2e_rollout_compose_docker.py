"""docs/progressive-delivery.md's compose rollout, run as the page writes it, on a real Docker engine: its
console blocks in order (tests/tutorial_pages.py), `make` finding compose itself (this engine has no plugin:
the Makefile falls back to the shipped binary), the stand-in images (test_e2e_docker.py's fixtures) and a
stand-in Prometheus image (Debian's `prometheus` on the stand-in Debian). A retrain with the same seed is
promoted, one with another seed rolled back at the shadow step, and each command prints what the page shows.
Serving polls its config every second (an override file), as in test_e2e_rollout_docker.py."""

from __future__ import annotations

import io
import os
import shutil
import sys
import tarfile
from pathlib import Path

import pytest
from test_e2e_docker import compose, env  # noqa: F401 (a fixture)
from tutorial_pages import missing_lines, outputs, read_blocks, run_script, script

from conftest import REPO, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("docker")]  # one worker drives the engine

PROJECT = "trainserve-e2e-compose-rollout"  # its own containers and volumes, removed at the end
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


@pytest.fixture()
def page_env(env, prometheus_image, tmp_path) -> dict:  # noqa: F811 (the imported fixture)
    override = tmp_path / "fast-poll.yaml"
    override.write_text("services:\n  serve-cpu:\n    environment:\n      MODEL_CONFIG_POLL_WAIT_SECONDS: '1'\n")
    ports = ("GRPC_PORT", "REST_PORT", "PROXY_GRPC_PORT", "PROXY_REST_PORT", "PROMETHEUS_PORT")
    return {
        **env,
        **{port: str(free_port()) for port in ports},
        "COMPOSE_PROJECT_NAME": PROJECT,
        "COMPOSE_FILE": os.pathsep.join([str(REPO / "compose.yaml"), str(override)]),
        "PROMETHEUS_IMAGE": prometheus_image,
        "VENV": str(Path(sys.executable).parent.parent),  # the Makefile's fallback: $(VENV)/bin/docker-compose
        "EPOCHS": "5",
        "MIN_ACCURACY": "0",
    }


def section_blocks(tmp_path: Path):
    text = PAGE.read_text()
    start, end = (text.index(heading) for heading in SECTION)
    (tmp_path / "section.md").write_text(text[start:end])
    return read_blocks(tmp_path / "section.md")


def test_the_pages_compose_rollout_promotes_a_good_candidate_and_rolls_back_a_bad_one(
    docker_client, page_env, tmp_path
):
    blocks = section_blocks(tmp_path)
    text, steps = script([b for b in blocks if b.lang == "console"], {})
    try:
        code, printed = run_script(text, REPO, page_env, timeout=1500)
    finally:
        profiles = [f"--profile={p}" for p in ("train", "eval", "promote", "proxy", "monitoring", "load")]
        compose(page_env, *profiles, "down", "-v", "--remove-orphans", check=False)
    by_step = outputs(printed)
    assert code == 0 and len(by_step) == len(steps), printed[-6000:]
    for number, step in enumerate(steps):
        missing = missing_lines(step.shown, by_step[number])
        assert not missing, f"`{step.command}` did not print {missing}:\n{by_step[number][-4000:]}"
    assert "make: compose is" in printed
    volumes = docker_client.volumes.list(filters={"label": f"com.docker.compose.project={PROJECT}"})
    assert not volumes, [v.name for v in volumes]
