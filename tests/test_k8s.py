"""Kubernetes manifests: rendered by kustomize, validated against the API schemas, policy-scanned,
and checked for what a cluster would only reveal at run time (ports, flags, versions)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, pinned_tf_version, require
from trainserve.serving.config import parse_batching, parse_model_config, parse_monitoring

KUSTOMIZATIONS = ["k8s/base", "k8s/overlays/local", "k8s/overlays/gpu", "k8s/overlays/multi-worker"]
TOOLS = Path(sys.executable).parent.parent / "tools" / "bin"  # .venv/tools: see the Makefile
KUBERNETES_VERSION = "1.33.0"


def render(path: str) -> list[dict]:
    require("kubectl", shutil.which("kubectl") is not None, "kubectl kustomize renders the manifests")
    proc = subprocess.run(["kubectl", "kustomize", str(REPO / path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def pod_specs(docs: list[dict]):
    for doc in docs:
        if doc["kind"] in ("Deployment", "Job"):
            yield doc, doc["spec"]["template"]["spec"]


@pytest.fixture(scope="module", params=KUSTOMIZATIONS)
def rendered(request, tmp_path_factory) -> tuple[str, list[dict], Path]:
    docs = render(request.param)
    path = tmp_path_factory.mktemp("k8s") / "rendered.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return request.param, docs, path


def test_kubernetes_validate_strict(rendered):
    _, _, path = rendered
    proc = subprocess.run(
        [TOOLS / "kubernetes-validate", "--strict", "--quiet", "-k", KUBERNETES_VERSION, path],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_policy_scan_has_no_failed_checks(rendered, tmp_path):
    _, _, path = rendered
    proc = subprocess.run(
        [TOOLS / "checkov", "-f", path, "--framework", "kubernetes", "--compact", "--quiet", "--skip-download"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0 and "Failed checks: 0" in proc.stdout, proc.stdout[-4000:]


def test_images_carry_the_pinned_tensorflow_version(rendered):
    _, docs, _ = rendered
    images = {c["image"] for _, spec in pod_specs(docs) for c in spec["containers"]}
    assert images and all(image.endswith(f":{pinned_tf_version()}") for image in images), images


def test_probes_target_named_ports_that_exist(rendered):
    _, docs, _ = rendered
    for doc, spec in pod_specs(docs):
        for container in spec["containers"]:
            names = {p["name"] for p in container.get("ports", [])}
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                if probe in container:
                    action = next(
                        container[probe][k] for k in ("httpGet", "tcpSocket", "grpc") if k in container[probe]
                    )
                    port = action["port"]
                    assert port in names, f"{doc['metadata']['name']}: {probe} targets {port!r}, ports are {names}"


def test_every_container_is_locked_down(rendered):
    _, docs, _ = rendered
    for doc, spec in pod_specs(docs):
        assert spec["securityContext"]["runAsNonRoot"] and spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        for container in spec["containers"]:
            ctx = container["securityContext"]
            assert ctx["readOnlyRootFilesystem"] and not ctx["allowPrivilegeEscalation"]
            assert ctx["capabilities"]["drop"] == ["ALL"]
            assert {"requests", "limits"} <= set(container["resources"]), doc["metadata"]["name"]
            assert any(m["mountPath"] == "/tmp" for m in container["volumeMounts"]), "scratch for a read-only root"


def test_serving_is_consistent(rendered):
    name, docs, _ = rendered
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    deployment = by_kind[("Deployment", "serve-cpu")]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    threads = {e["name"]: e for e in container["env"] if e["name"].startswith("TF_")}
    assert all(e["valueFrom"]["resourceFieldRef"]["resource"] == "limits.cpu" for e in threads.values())
    assert all(m.get("readOnly") for m in container["volumeMounts"] if m["mountPath"] == "/models")
    ports = {p["name"] for p in by_kind[("Service", "serve-cpu")]["spec"]["ports"]}
    assert ports == {"grpc", "http"}
    config = by_kind[("ConfigMap", "serve-cpu-config")]["data"]
    tmp = Path(__import__("tempfile").mkdtemp())
    for key, parse in (("models.config", parse_model_config), ("batching.config", parse_batching),
                       ("monitoring.config", parse_monitoring)):  # fmt: skip
        (tmp / key).write_text(config[key])
        parse(tmp / key)
    access = {d["metadata"]["name"]: d["spec"]["accessModes"] for d in docs if d["kind"] == "PersistentVolumeClaim"}
    expected = ["ReadWriteOnce"] if name.endswith("local") else ["ReadWriteMany"]
    assert access == {"models": expected, "data": expected}


def test_multi_worker_component_wires_dns_and_tf_config():
    docs = render("k8s/overlays/multi-worker")
    jobs = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Job"}
    assert "train" not in jobs, "the component replaces the single-pod training Job"
    job = jobs["train-mw"]
    spec = job["spec"]["template"]["spec"]
    service = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == spec["subdomain"])
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["selector"] == {"job-name": "train-mw"}
    assert job["spec"]["completionMode"] == "Indexed"
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert env["TRAINSERVE_WORKERS"] == str(job["spec"]["completions"]) == str(job["spec"]["parallelism"])
    assert env["TRAINSERVE_SERVICE"] == service["metadata"]["name"] and env["TRAINSERVE_JOB_NAME"] == "train-mw"
    assert "trainserve tf-config" in " ".join(spec["containers"][0]["command"])
    assert all(d["metadata"].get("namespace") == "trainserve" for d in docs if d["kind"] != "Namespace")
