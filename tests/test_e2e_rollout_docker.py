"""Gated rollout in compose on a real Docker engine: `make promote` and `make rollback` themselves, on the
stand-in images (test_e2e_docker.py builds them; its fixtures and helpers are reused here).

v1 trained -> make promote -> `stable` = 1; v2 trained -> make promote with a threshold no model meets: the
eval step fails, promote then refuses the failed report, `stable` still 1; promote --override -> 2 -> make
rollback -> 1; the history on the `rollout` volume records each step. Serving polls its config every second
here (an override file) instead of 10 s: the same flow, a minute shorter.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from test_e2e_docker import compose, env  # noqa: F401 (a fixture)

from conftest import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("docker")]  # one worker drives the engine

PROJECT = "trainserve-e2e-rollout"  # its own containers and volumes, removed at the end
MODEL = "cats"  # not the images' default: the promote profile must take MODEL_NAME too
IMPOSSIBLE = "1.01"  # accuracy >= 1.01: the gate fails whatever the model


@pytest.fixture()
def rollout_env(env, tmp_path) -> dict:  # noqa: F811 (the imported fixture)
    override = tmp_path / "fast-poll.yaml"
    override.write_text("services:\n  serve-cpu:\n    environment:\n      MODEL_CONFIG_POLL_WAIT_SECONDS: '1'\n")
    return {
        **env,
        "COMPOSE_PROJECT_NAME": PROJECT,
        "COMPOSE_FILE": os.pathsep.join([str(REPO / "compose.yaml"), str(override)]),
        "MODEL_NAME": MODEL,
        "EPOCHS": "1",  # the gate's mechanics are under test, not the model's quality
        "MIN_ACCURACY": "0",
        "COMPOSE": str(Path(os.sys.executable).parent / "docker-compose"),  # the one the helpers use
    }


def make(project: dict, target: str, **variables: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "--no-print-directory", target, f"COMPOSE={project['COMPOSE']}"],
        cwd=REPO,
        env={**project, **variables},
        capture_output=True,
        text=True,
        timeout=600,
    )


def train(project: dict, version: int) -> None:
    out = compose(project, "--profile", "train", "run", "--rm", "train-cpu").stdout
    assert f"published {MODEL} version {version}" in out, out[-3000:]


def output(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout[-3000:] + proc.stderr[-3000:]


def stable(project: dict) -> int | None:
    """The version Predict would answer for label `stable` (GetModelMetadata resolves labels as Predict does)."""
    from trainserve.client import ServingClient

    server = ServingClient(f"127.0.0.1:{project['GRPC_PORT']}")
    try:
        return server.label_version(MODEL, "stable")
    finally:
        server.close()


def history(project: dict) -> list[dict]:
    out = compose(
        project,
        "--profile",
        "promote",
        "run",
        "--rm",
        "--no-deps",
        "--entrypoint",
        "cat",
        "rollback",
        "/rollout/models.config.history.jsonl",
    ).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_make_promote_gates_and_make_rollback_restores(docker_client, rollout_env):  # noqa: F811
    project = rollout_env
    profiles = ("--profile", "train", "--profile", "eval", "--profile", "promote")
    try:
        compose(project, "up", "-d", "serve-cpu")
        train(project, 1)

        # First run: no stable yet; the first candidate that passes becomes stable.
        first = make(project, "promote")
        assert first.returncode == 0 and "promoted: model cats" in first.stdout, output(first)
        assert stable(project) == 1

        # v2 misses its gate: make promote stops at eval; promote itself refuses the failed report.
        train(project, 2)
        gated = make(project, "promote", MIN_ACCURACY=IMPOSSIBLE)
        assert gated.returncode != 0 and "gate failed" in output(gated), output(gated)
        refused = compose(project, "--profile", "promote", "run", "--rm", "promote", check=False)
        assert refused.returncode == 2 and "version 2 did not pass" in output(refused), output(refused)
        assert stable(project) == 1

        # An override, with its reason, moves stable anyway (the history keeps both); make rollback brings v1 back.
        compose(
            project,
            "--profile",
            "promote",
            "run",
            "--rm",
            "promote",
            "promote",
            "--report",
            "/reports/candidate.json",
            "--override",
            "gates",
            "--reason",
            "e2e test: the override path",
        )
        assert stable(project) == 2
        rolled = make(project, "rollback")
        assert rolled.returncode == 0, output(rolled)
        assert stable(project) == 1

        steps = [(h["action"], h["after"].get("stable"), h.get("overridden")) for h in history(project)]
        assert steps == [
            ("candidate", None, None),
            ("promote", 1, []),
            ("candidate", 1, None),
            ("promote", 2, ["gates"]),
            ("rollback", 1, None),
        ], steps
    finally:
        compose(project, *profiles, "down", "-v", "--remove-orphans", check=False)
    volumes = docker_client.volumes.list(filters={"label": f"com.docker.compose.project={PROJECT}"})
    assert not volumes, [v.name for v in volumes]
