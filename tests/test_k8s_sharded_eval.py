"""The sharded-eval component: the eval Job as an Indexed Job whose pods evaluate one shard each, rendered
on an overlay, validated against the API schema, and its shard flags parsed by the real CLI."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import yaml
from test_k8s import KUBERNETES_VERSION, TOOLS

from conftest import REPO, require
from trainserve.cli import build_parser
from trainserve.shards import parse_shard

pytestmark = pytest.mark.unit  # kubectl and the validator run as subprocesses; nothing imports TensorFlow
COMPONENT = REPO / "k8s" / "components" / "sharded-eval"


def render_eval_job(tmp_path, component=COMPONENT) -> tuple[dict, str]:
    """The eval Job of the local overlay with the sharded-eval component, and the whole rendering."""
    require("kubectl", shutil.which("kubectl") is not None, "kubectl kustomize renders the manifests")
    k8s = os.path.relpath(REPO / "k8s", tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [{k8s}/overlays/local]\ncomponents: [{os.path.relpath(component, tmp_path)}]\n"
    )
    proc = subprocess.run(
        ["kubectl", "kustomize", "--load-restrictor", "LoadRestrictionsNone", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    (job,) = [
        d for d in yaml.safe_load_all(proc.stdout) if d and d["kind"] == "Job" and d["metadata"]["name"] == "eval"
    ]
    return job, proc.stdout


def test_indexed_eval_job_gives_each_pod_its_own_shard_and_report(tmp_path):
    job, text = render_eval_job(tmp_path)
    (tmp_path / "rendered.yaml").write_text(text)
    check = subprocess.run(
        [TOOLS / "kubernetes-validate", "--strict", "--quiet", "-k", KUBERNETES_VERSION, tmp_path / "rendered.yaml"],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 4
    args = spec["template"]["spec"]["containers"][0]["args"]
    shard = next(a for a in args if a.startswith("--shard="))
    assert shard == "--shard=$(JOB_COMPLETION_INDEX)/4"
    assert "--report=/reports/shards/eval-$(JOB_COMPLETION_INDEX).json" in args
    assert not any(a.startswith("--min-accuracy") for a in args), "the merged report is gated, not each shard"
    for index in range(4):  # what the kubelet expands it to, parsed by the real CLI
        expanded = [a.replace("$(JOB_COMPLETION_INDEX)", str(index)).replace("$(MODEL_NAME)", "m") for a in args]
        parsed = build_parser().parse_args(["eval", *expanded])
        assert parsed.shard == parse_shard(f"{index}/4")


def test_the_shard_count_is_declared_once(tmp_path):
    """Change `completions` alone and every pod's --shard and the parallelism follow."""
    component = tmp_path / "component"
    shutil.copytree(COMPONENT, component)
    text = (component / "kustomization.yaml").read_text()
    assert text.count("/spec/completions, value: 4}") == 1
    (component / "kustomization.yaml").write_text(
        text.replace("/spec/completions, value: 4}", "/spec/completions, value: 3}")
    )
    (tmp_path / "overlay").mkdir()
    job, _ = render_eval_job(tmp_path / "overlay", component)
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 3
    assert "--shard=$(JOB_COMPLETION_INDEX)/3" in job["spec"]["template"]["spec"]["containers"][0]["args"]
