"""The Makefile's compose: `docker compose` where the engine has the plugin, else the shipped
`.venv/bin/docker-compose` (Debian's docker.io has no plugin: `docker compose` there is `unknown flag:
--profile`), said once on stderr; COMPOSE= overrides both. A `docker` script on PATH stands in for an engine
with and without the plugin; `make -n` prints the commands without running them."""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import REPO

pytestmark = pytest.mark.integration  # runs make

COMPOSE = yaml.safe_load((REPO / "compose.yaml").read_text())
WITHOUT_PLUGIN = '[ "$1" = compose ] && { echo "docker: unknown command: docker compose" >&2; exit 1; }\nexit 0\n'
WITH_PLUGIN = "exit 0\n"


def dry_run(tmp_path: Path, docker: str, *args: str) -> subprocess.CompletedProcess:
    """`make -n ARGS` with a `docker` whose script is `docker`, ahead of the system's on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "docker").write_text("#!/bin/sh\n" + docker)
    (bin_dir / "docker").chmod(0o755)
    return subprocess.run(
        ["make", "--no-print-directory", "-n", *args],
        cwd=REPO,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def test_without_the_plugin_every_target_uses_the_shipped_binary_and_says_so_once(tmp_path):
    venv = tmp_path / "venv"
    made = dry_run(tmp_path, WITHOUT_PLUGIN, "serve", "promote", "rollout", f"VENV={venv}")
    lines = made.stdout.splitlines()
    assert lines[0] == f"{venv}/bin/docker-compose up -d serve-cpu", made.stdout
    assert len(lines) == 8 and all(line.startswith(f"{venv}/bin/docker-compose --profile ") for line in lines[1:])
    said = [line for line in made.stderr.splitlines() if "compose is" in line]
    assert said == [f"make: compose is {venv}/bin/docker-compose (no docker compose plugin; make venv installs it)"]


def test_with_the_plugin_docker_compose_is_used(tmp_path):
    made = dry_run(tmp_path, WITH_PLUGIN, "rollback", "TLS=1")
    assert made.stdout.splitlines() == [
        "docker compose -f compose.yaml -f compose.tls.yaml --profile promote run --rm rollback"
    ]
    assert "make: compose is docker compose" in made.stderr.splitlines()


def test_compose_given_overrides_both_and_nothing_is_said(tmp_path):
    made = dry_run(tmp_path, WITHOUT_PLUGIN, "eval", "COMPOSE=my-compose")
    assert made.stdout.splitlines() == ["my-compose --profile eval run --rm eval"]
    assert "compose is" not in made.stderr


def test_a_target_without_compose_says_nothing_of_it(tmp_path):
    assert "compose is" not in dry_run(tmp_path, WITHOUT_PLUGIN, "help").stderr


def resolved_environment(service: dict) -> dict:
    """A compose service's environment with its `${VAR:-default}` values as compose resolves them unset."""
    return {name: re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(value)) for name, value in service["environment"].items()}


def parsed_as_flags(command: str, settings: dict, monkeypatch) -> argparse.Namespace:
    """`trainserve COMMAND` parsed with SETTINGS as its environment; each setting must name one of its flags."""
    from trainserve.cli import build_parser

    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    args = build_parser().parse_args([command])
    flags = [name for name in settings if name.startswith("TRAINSERVE_")]
    assert all(hasattr(args, name.removeprefix("TRAINSERVE_").lower()) for name in flags), sorted(flags)
    return args


def test_compose_rollouts_demonstration_settings_are_valid_flags_over_the_one_file(monkeypatch):
    """compose's `rollout` service as the page runs it: the env file, then its own settings, parse as `trainserve
    rollout` flags (a misspelt name or a bad plan would surface only in Docker), and Prometheus on compose scrapes
    at least as often as the rollout looks."""
    from trainserve.options import config_from_args
    from trainserve.rollout.rollout_config import RolloutConfig

    service = COMPOSE["services"]["rollout"]
    (env_file,) = service["env_file"]
    pairs = [line.split("=", 1) for line in (REPO / env_file).read_text().splitlines() if line and line[0] != "#"]
    args = parsed_as_flags("rollout", {**dict(pairs), **resolved_environment(service)}, monkeypatch)
    config = config_from_args(RolloutConfig, args)
    assert [step.kind for step in config.plan.steps] == ["shadow", "canary", "promote"], config.plan  # not auto
    gate = config.gate
    assert (gate.max_error_increase, gate.min_requests, gate.max_shadow_dropped) == (0.05, 50, 0.8), gate
    scrape = yaml.safe_load((REPO / "monitoring" / "prometheus-compose.yml").read_text())["global"]["scrape_interval"]
    assert float(scrape.removesuffix("s")) <= config.interval, (scrape, config.interval)


def test_compose_proxys_shed_margin_is_its_flag(monkeypatch):
    """The proxy's demonstration margin (shadow copies shed only while calls are 4 times slower than quiet ones)
    reaches `trainserve proxy` as its flag."""
    from trainserve.options import config_from_args
    from trainserve.proxy.config import ProxyConfig

    args = parsed_as_flags("proxy", resolved_environment(COMPOSE["services"]["proxy"]), monkeypatch)
    assert config_from_args(ProxyConfig, args).shadow_shed_latency_margin == 3.0
