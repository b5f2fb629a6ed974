"""What TF Serving would swallow silently, caught before anything runs: flags, config files, versions."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, pinned_tf_version
from trainserve.serving.config import TF_SERVING_FLAGS, parse_batching, parse_model_config, parse_monitoring

pytestmark = pytest.mark.unit  # docker-compose config, hadolint: subprocesses without TensorFlow or a Docker engine
SERVE_CPU = REPO / "images" / "serve-cpu"
BIN = Path(sys.executable).parent


def flags_in(text: str) -> set[str]:
    return set(re.findall(r"--([a-z][a-z0-9_]*)(?==)", text))


def serving_arguments() -> dict[str, str]:
    """Every place that hands flags to tensorflow_model_server: the image's entrypoint, plus any
    command/args that compose or a Kubernetes manifest gives the serving container."""
    found = {"images/serve-cpu/entrypoint.sh": (SERVE_CPU / "entrypoint.sh").read_text()}
    serve = yaml.safe_load((REPO / "compose.yaml").read_text())["services"]["serve-cpu"]
    found["compose.yaml"] = " ".join(map(str, serve.get("command", []) + serve.get("entrypoint", [])))
    for manifest in sorted((REPO / "k8s").rglob("*.yaml")):
        for doc in yaml.safe_load_all(manifest.read_text()):
            spec = (doc or {}).get("spec", {}).get("template", {}).get("spec", {})
            for container in spec.get("containers", []):
                if "serve-cpu" in container.get("image", ""):
                    args = container.get("command", []) + container.get("args", [])
                    found[str(manifest.relative_to(REPO))] = " ".join(args)
    return found


def test_every_serving_flag_is_a_real_tensorflow_model_server_flag():
    sources = serving_arguments()
    entrypoint = flags_in(sources["images/serve-cpu/entrypoint.sh"])
    assert {"port", "rest_api_port", "model_config_file", "enable_batching"} <= entrypoint, "the check sees flags"
    assert any(path.startswith("k8s/") for path in sources), "the check sees the serving Deployment"
    for source, text in sources.items():
        unknown = flags_in(text) - TF_SERVING_FLAGS
        assert not unknown, f"{source}: unknown tensorflow_model_server flags {sorted(unknown)}"


def test_a_typo_would_be_caught():
    assert flags_in("--rest_api_prot=8501 --port=1") - TF_SERVING_FLAGS == {"rest_api_prot"}


def test_baked_config_files_parse_with_tf_serving_schemas(tmp_path):
    # models.config is a template: the entrypoint fills in MODEL_NAME (test_serve_cpu_scripts runs it).
    template = (SERVE_CPU / "models.config.template").read_text()
    assert "digits" not in template, "the default config names no model: MODEL_NAME does"
    (tmp_path / "models.config").write_text(template.replace("${MODEL_NAME}", "cats"))
    config = parse_model_config(tmp_path / "models.config")
    (model,) = config.model_config_list.config
    assert (model.name, model.base_path) == ("cats", "/models/cats")
    assert model.model_version_policy.latest.num_versions == 2
    batching = parse_batching(SERVE_CPU / "batching.config")
    assert batching.max_batch_size >= 256, "the eval client's default batch must fit"
    assert parse_monitoring(SERVE_CPU / "monitoring.config") == "/monitoring/prometheus/metrics"


def test_one_tensorflow_version_everywhere():
    version = pinned_tf_version()
    env = dict(
        line.split("=", 1) for line in (REPO / ".env").read_text().splitlines() if "=" in line and line[0] != "#"
    )
    assert env["TF_VERSION"] == version
    for dockerfile in sorted((REPO / "images").glob("*/Dockerfile")):
        for found in re.findall(r"ARG TF_VERSION=(\S+)", dockerfile.read_text()):
            assert found == version, f"{dockerfile.relative_to(REPO)} pins TensorFlow {found}, pyproject {version}"
    manifests = sorted((REPO / "k8s").rglob("*.yaml")) if (REPO / "k8s").is_dir() else []
    for manifest in manifests:
        for tag in re.findall(r"image:\s*\S+:(\d+\.\d+\.\d+)", manifest.read_text()):
            assert tag == version, f"{manifest.relative_to(REPO)} uses image tag {tag}, pyproject pins {version}"


@pytest.mark.parametrize(
    "profiles",
    [
        [],
        ["train"],
        ["eval"],
        ["promote"],
        ["proxy"],
        ["monitoring"],
        ["train", "eval", "promote", "proxy", "monitoring"],
    ],
    ids=["default", "train", "eval", "promote", "proxy", "monitoring", "all"],
)
def test_compose_config_is_valid_for_every_profile(profiles):
    compose = shutil.which("docker-compose", path=str(BIN)) or shutil.which("docker-compose")
    args = [a for p in profiles for a in ("--profile", p)]
    proc = subprocess.run([compose, *args, "config", "--format", "json"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    import json

    services = json.loads(proc.stdout)["services"]
    serve = services["serve-cpu"]
    assert all(p["host_ip"] == "127.0.0.1" for p in serve["ports"]), "ports published on loopback only"
    assert any(v["target"] == "/models" and v.get("read_only") for v in serve["volumes"])
    assert "healthcheck" in serve
    if "train" in profiles:
        devices = services["train-gpu"]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["capabilities"] == ["gpu"] and devices[0]["driver"] == "nvidia"
    if "eval" in profiles:
        assert services["eval"]["depends_on"]["serve-cpu"]["condition"] == "service_healthy"
    if "proxy" in profiles:  # the proxy needs no TensorFlow: the eval image, in front of a healthy serve-cpu
        proxy = services["proxy"]
        assert proxy["image"].rpartition(":")[0] == "trainserve/eval" and proxy["entrypoint"][1] == "proxy"
        assert proxy["depends_on"]["serve-cpu"]["condition"] == "service_healthy" and "healthcheck" in proxy
        assert all(p["host_ip"] == "127.0.0.1" for p in proxy["ports"])
        assert proxy["environment"]["TRAINSERVE_UPSTREAM"] == "serve-cpu:8500"
    if "promote" in profiles:  # the rollout steps need no TensorFlow: the eval image, as the k8s Jobs
        for step in ("candidate", "promote", "rollback"):
            assert services[step]["image"].rpartition(":")[0] == "trainserve/eval", step
            assert services[step]["entrypoint"] == ["trainserve"] and services[step]["command"][0] == step
        # `make promote` runs promote-eval right after `candidate` loaded the version: serve-cpu's health may
        # still say unhealthy (from before its first version) for one interval, and compose would refuse.
        assert services["promote-eval"]["depends_on"]["serve-cpu"]["condition"] == "service_started"
    if "monitoring" in profiles:  # the repository's scrape config and rules, read-only; the UI on loopback only
        prometheus = services["prometheus"]
        (mount,) = [v for v in prometheus["volumes"] if v["target"] == "/etc/trainserve-monitoring"]
        assert mount["read_only"] and Path(mount["source"]) == REPO / "monitoring"
        config = next(a for a in prometheus["command"] if a.startswith("--config.file="))
        assert (REPO / "monitoring" / Path(config.split("=", 1)[1]).name).is_file()
        assert all(p["host_ip"] == "127.0.0.1" for p in prometheus["ports"]) and "healthcheck" in prometheus
    else:
        assert "prometheus" not in services, "opt-in: only with --profile monitoring"


def test_dockerfiles_pass_hadolint():
    hadolint = shutil.which("hadolint", path=str(BIN)) or shutil.which("hadolint")
    files = sorted(map(str, (REPO / "images").glob("*/Dockerfile")))
    proc = subprocess.run([hadolint, *files], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
