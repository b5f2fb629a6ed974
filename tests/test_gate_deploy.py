"""The gated rollout as deployed: `make promote`, compose's promote profile and the Kubernetes promote Job gate the
candidate on its own held-out split, on non-inferiority to stable (a stated margin, MAX_DROP) and MIN_ACCURACY by
default, and a user can turn either off. Rendered (kustomize, `docker-compose config`, `make -n`) and read, not run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_k8s import all_containers, flag, render, volume_path

from conftest import REPO
from trainserve.cli import build_parser
from trainserve.evaluation.config import EvalConfig, parse_max_drop
from trainserve.evaluation.preflight import AUTO
from trainserve.options import config_from_args

pytestmark = pytest.mark.unit  # kubectl, docker-compose config and make -n run as subprocesses; nothing is started
COMPOSE = Path(sys.executable).parent / "docker-compose"
DEFAULT = None  # what make promote, compose and the k8s Job gate on (auto): eval's own default margin rule


def eval_config(args: list[str], env: dict[str, str] | None = None) -> EvalConfig:
    """What `trainserve eval` makes of these flags and TRAINSERVE_* variables."""
    saved = dict(os.environ)
    try:
        os.environ.update(env or {})
        return config_from_args(EvalConfig, build_parser().parse_args(["eval", *args]))
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_the_promote_job_compares_with_stable_on_the_candidates_own_split():
    docs = render("k8s/base")
    (cronjob,) = [d for d in docs if d["kind"] == "CronJob" and d["metadata"]["name"] == "promote"]
    spec = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    step = {c["name"]: c for c in all_containers(spec)}["eval"]
    config = eval_config([a.replace("$(MODEL_NAME)", "digits").replace("$(JOB_NAME)", "p") for a in step["args"]])
    assert (config.label, config.compare_with, config.allow_no_baseline, config.not_worse) == (
        "candidate",
        "stable",
        True,
        True,
    )
    assert config.min_accuracy and config.min_accuracy > 0
    assert flag(step, "max-drop") == AUTO and config.max_drop is None, "eval's default margin rule"
    assert config.data == "held-out"
    claim, inside, _ = volume_path(spec, step, f"{flag(step, 'data-dir')}/digits/versions/3.json")
    assert (claim, inside) == ("data", "digits/versions/3.json"), "where training writes the version records"
    claim, inside, _ = volume_path(spec, step, str(config.rollout_config))
    promote_step = {c["name"]: c for c in all_containers(spec)}["promote"]
    assert (claim, inside) == ("models", ".rollout/models.config"), "the labels the rollout steps write"
    assert f"--config={config.rollout_config}" in promote_step["args"], "promote's own config"
    (job,) = [d for d in docs if d["kind"] == "Job" and d["metadata"]["name"] == "eval"]
    assert {"--data=held-out", "--data-dir=/data"} <= set(job["spec"]["template"]["spec"]["containers"][0]["args"])


def compose_config(**env: str) -> dict:
    proc = subprocess.run(
        [COMPOSE, "-f", REPO / "compose.yaml", "--profile", "promote", "config", "--format", "yaml"],
        cwd=REPO,
        env={k: v for k, v in os.environ.items() if k not in ("COMPARE_WITH", "MIN_ACCURACY", "MAX_DROP")} | env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0 and not COMPOSE.exists():
        pytest.skip("docker-compose is not installed in the venv")
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)


@pytest.mark.parametrize(
    ("env", "compare_with", "min_accuracy", "max_drop"),
    [
        pytest.param({}, "stable", 0.9, DEFAULT, id="default-both-gates"),
        pytest.param({"COMPARE_WITH": ""}, None, 0.9, DEFAULT, id="comparison-off"),
        pytest.param({"MIN_ACCURACY": ""}, "stable", None, DEFAULT, id="min-accuracy-off"),
        pytest.param({"MAX_DROP": ""}, "stable", 0.9, None, id="empty-is-evals-default-margin"),
        pytest.param({"MAX_DROP": "none"}, "stable", 0.9, [], id="none-is-significance-only"),
    ],
)
def test_compose_promote_eval_gates_by_default_and_each_gate_turns_off(env, compare_with, min_accuracy, max_drop):
    service = compose_config(**env)["services"]["promote-eval"]
    variables = {k: str(v) for k, v in service["environment"].items() if k.startswith("TRAINSERVE_")}
    config = eval_config([], variables)
    assert (config.compare_with, config.min_accuracy, config.label) == (compare_with, min_accuracy, "candidate")
    assert (config.max_drop if config.max_drop is None else [m.describe() for m in config.max_drop]) == max_drop
    assert config.data == "held-out" and config.allow_no_baseline is True
    mounts = {m["target"]: m["source"] for m in service["volumes"]}
    assert mounts[str(config.data_dir)] == "data" and mounts[str(config.report.parent)] == "reports"
    promote = compose_config(**env)["services"]["promote"]["environment"]["TRAINSERVE_CONFIG"]
    assert str(config.rollout_config) == promote and mounts[str(config.rollout_config.parent)] == "rollout"


def test_env_and_evals_own_default_are_the_same_margin_rule():
    """.env's MAX_DROP (what `make promote` and compose read) is `auto`: eval's own default, the margin the split's
    examples decide, not a number that drifts from it."""
    (line,) = [x for x in (REPO / ".env").read_text().splitlines() if x.startswith("MAX_DROP=")]
    assert line == f"MAX_DROP={AUTO}" and parse_max_drop(line.split("=", 1)[1]) is None
    assert eval_config([]).max_drop is None


def test_make_promote_runs_candidate_then_the_gate_then_promote():
    proc = subprocess.run(
        ["make", "-n", "--no-print-directory", "promote", "COMPOSE=compose"], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    steps = [line.split()[-1] for line in proc.stdout.splitlines() if line.startswith("compose ")]
    assert steps == ["candidate", "promote-eval", "promote"]
