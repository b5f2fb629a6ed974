"""The sharded-eval component: the eval Job as an Indexed Job whose pods evaluate one shard each, rendered
on an overlay, validated against the API schema, and its shard flags parsed by the real CLI."""

from __future__ import annotations

import os
import shutil
import subprocess

import yaml
from test_k8s import KUBERNETES_VERSION, TOOLS

from conftest import REPO, require
from trainserve.cli import build_parser
from trainserve.evaluation.config import parse_shard


def test_indexed_eval_job_gives_each_pod_its_own_shard_and_report(tmp_path):
    require("kubectl", shutil.which("kubectl") is not None, "kubectl kustomize renders the manifests")
    k8s = os.path.relpath(REPO / "k8s", tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [{k8s}/overlays/local]\ncomponents: [{k8s}/components/sharded-eval]\n"
    )
    proc = subprocess.run(
        ["kubectl", "kustomize", "--load-restrictor", "LoadRestrictionsNone", str(tmp_path)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (tmp_path / "rendered.yaml").write_text(proc.stdout)
    check = subprocess.run(
        [TOOLS / "kubernetes-validate", "--strict", "--quiet", "-k", KUBERNETES_VERSION, tmp_path / "rendered.yaml"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    (job,) = [
        d for d in yaml.safe_load_all(proc.stdout) if d and d["kind"] == "Job" and d["metadata"]["name"] == "eval"
    ]
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
