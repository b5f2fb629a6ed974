"""Kubernetes manifests: rendered by kustomize, validated against the API schemas, policy-scanned,
and checked for what a cluster would only reveal at run time (ports, flags, versions)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, pinned_tf_version, require
from trainserve.serving.config import parse_batching, parse_monitoring

# The unit tests here: kubectl and the validators run as subprocesses; nothing imports TensorFlow. One worker runs
# the module: its renders and checkov's scan (half a minute) are made once, not once per xdist worker.
pytestmark = pytest.mark.xdist_group("k8s")
SERVE_CPU = REPO / "images" / "serve-cpu"
KUSTOMIZATIONS = [
    "k8s/base",
    "k8s/overlays/local",
    "k8s/overlays/gpu",
    "k8s/overlays/multi-worker",
    "k8s/overlays/tls",
    "k8s/overlays/proxy",
]
TOOLS = Path(sys.executable).parent.parent / "tools" / "bin"  # .venv/tools: see the Makefile
KUBERNETES_VERSION = "1.33.0"


def render(path: str) -> list[dict]:
    require("kubectl", shutil.which("kubectl") is not None, "kubectl kustomize renders the manifests")
    proc = subprocess.run(["kubectl", "kustomize", str(REPO / path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def pod_templates(docs: list[dict]):
    """(workload, its pod template) for every workload that makes pods."""
    for doc in docs:
        if doc["kind"] in ("Deployment", "Job"):
            yield doc, doc["spec"]["template"]
        elif doc["kind"] == "CronJob":  # the rollout Jobs' templates
            yield doc, doc["spec"]["jobTemplate"]["spec"]["template"]


def pod_specs(docs: list[dict]):
    for doc, template in pod_templates(docs):
        yield doc, template["spec"]


def all_containers(spec: dict) -> list[dict]:
    return spec.get("initContainers", []) + spec["containers"]


@pytest.fixture(scope="module")
def renders(tmp_path_factory) -> dict[str, tuple[list[dict], Path]]:
    """Every kustomization rendered once: its documents and the file they were written to."""
    directory = tmp_path_factory.mktemp("k8s")
    found = {}
    for kustomization in KUSTOMIZATIONS:
        docs = render(kustomization)
        path = directory / f"{kustomization.replace('/', '-')}.yaml"
        path.write_text(yaml.safe_dump_all(docs))
        found[kustomization] = docs, path
    return found


@pytest.fixture(params=KUSTOMIZATIONS)
def rendered(request, renders) -> tuple[str, list[dict], Path]:
    return request.param, *renders[request.param]


@pytest.fixture(scope="module")
def policy_scan(renders) -> dict:
    """checkov's JSON over every rendered file in one run (its start-up is most of a scan's time)."""
    paths = [path for _, path in renders.values()]
    files = [arg for path in paths for arg in ("-f", path.name)]
    proc = subprocess.run(
        [TOOLS / "checkov", *files, "--framework", "kubernetes", "--skip-download", "-o", "json"],
        capture_output=True,
        text=True,
        cwd=paths[0].parent,
    )
    assert proc.returncode in (0, 1), proc.stderr[-4000:]  # 1: some check failed, which the tests name
    return json.loads(proc.stdout)


@pytest.mark.integration
def test_kubernetes_validate_strict(rendered):
    _, _, path = rendered
    proc = subprocess.run(
        [TOOLS / "kubernetes-validate", "--strict", "--quiet", "-k", KUBERNETES_VERSION, path],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.integration
def test_policy_scan_has_no_failed_checks(rendered, policy_scan):
    _, _, path = rendered
    results = policy_scan["results"]

    def of_this_file(kind: str) -> list[dict]:
        return [r for r in results.get(kind, []) if Path(r["file_path"]).name == path.name]

    assert of_this_file("passed_checks"), f"checkov scanned nothing of {path.name}"
    assert not of_this_file("parsing_errors") and not results.get("parsing_errors")
    failed = [(r["check_id"], r["resource"], r["check_name"]) for r in of_this_file("failed_checks")]
    assert failed == [], failed


@pytest.mark.integration
def test_images_carry_the_pinned_tensorflow_version(rendered):
    _, docs, _ = rendered
    images = {c["image"] for _, spec in pod_specs(docs) for c in all_containers(spec)}
    assert images and all(image.endswith(f":{pinned_tf_version()}") for image in images), images


@pytest.mark.unit
def test_probes_target_named_ports_or_scripts_that_exist(rendered):
    _, docs, _ = rendered
    for doc, spec in pod_specs(docs):
        for container in spec["containers"]:
            names = {p["name"] for p in container.get("ports", [])}
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                if probe not in container:
                    continue
                if "exec" in container[probe]:  # the serving image's own script, with a mode it knows
                    script, *args = container[probe]["exec"]["command"]
                    assert script == "/usr/local/bin/healthcheck.sh" and "serve-cpu" in container["image"]
                    assert args in (["ready"], ["live"]), args
                    continue
                action = next(container[probe][k] for k in ("httpGet", "tcpSocket", "grpc") if k in container[probe])
                port = action["port"]
                assert port in names, f"{doc['metadata']['name']}: {probe} targets {port!r}, ports are {names}"


@pytest.mark.unit
def test_serving_probes_never_restart_a_pod_that_waits_for_its_first_model(rendered):
    """Serving is applied before training has published: readiness = serving, liveness = answering."""
    _, docs, _ = rendered
    container = serving_container(docs)
    assert "startupProbe" not in container, "a start-up limit would be a limit on how long training may take"
    assert container["readinessProbe"]["exec"]["command"][1:] == ["ready"]
    liveness = container["livenessProbe"]
    # TF Serving keeps its ports closed until the initial models are AVAILABLE: a port-based liveness
    # would kill the waiting pod. `healthcheck.sh live` passes while the port is closed.
    assert not {"httpGet", "tcpSocket", "grpc"} & set(liveness) and liveness["exec"]["command"][1:] == ["live"]
    (pdb,) = (d for d in docs if d["kind"] == "PodDisruptionBudget")
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow", "a waiting pod never blocks a drain"


@pytest.mark.unit
def test_every_container_is_locked_down(rendered):
    _, docs, _ = rendered
    for doc, spec in pod_specs(docs):
        assert spec["securityContext"]["runAsNonRoot"] and spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        for container in all_containers(spec):
            ctx = container["securityContext"]
            assert ctx["readOnlyRootFilesystem"] and not ctx["allowPrivilegeEscalation"]
            assert ctx["capabilities"]["drop"] == ["ALL"]
            assert {"requests", "limits"} <= set(container["resources"]), doc["metadata"]["name"]
            assert any(m["mountPath"] == "/tmp" for m in container["volumeMounts"]), "scratch for a read-only root"


def serving_container(docs: list[dict]) -> dict:
    (deployment,) = (d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "serve-cpu")
    # TF Serving's container; the proxy component adds a sidecar beside it.
    (container,) = (c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "serve-cpu")
    return container


def config_map(docs: list[dict], name: str) -> dict:
    """A generated ConfigMap, found by its name before kustomize's content-hash suffix."""
    (found,) = (d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].rsplit("-", 1)[0] == name)
    return found


@pytest.mark.unit
def test_serving_is_consistent(rendered):
    name, docs, _ = rendered
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    deployment = by_kind[("Deployment", "serve-cpu")]
    container = serving_container(docs)
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    threads = {e["name"]: e for e in container["env"] if e["name"].startswith("TF_")}
    assert all(e["valueFrom"]["resourceFieldRef"]["resource"] == "limits.cpu" for e in threads.values())
    assert all(m.get("readOnly") for m in container["volumeMounts"] if m["mountPath"] == "/models")
    ports = {p["name"] for p in by_kind[("Service", "serve-cpu")]["spec"]["ports"]}
    assert ports == {"grpc", "http"}
    generated = config_map(docs, "serve-cpu-config")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == generated["metadata"]["name"]
    config = generated["data"]
    # The image's own files, byte for byte (generated from images/serve-cpu, no copy); no models.config:
    # the entrypoint generates it from MODEL_NAME unless an overlay adds one.
    assert config == {key: (SERVE_CPU / key).read_text() for key in ("batching.config", "monitoring.config")}
    tmp = Path(__import__("tempfile").mkdtemp())
    for key, parse in (("batching.config", parse_batching), ("monitoring.config", parse_monitoring)):
        (tmp / key).write_text(config[key])
        parse(tmp / key)
    access = {d["metadata"]["name"]: d["spec"]["accessModes"] for d in docs if d["kind"] == "PersistentVolumeClaim"}
    expected = ["ReadWriteOnce"] if name.endswith(("local", "tls", "proxy")) else ["ReadWriteMany"]  # on local
    captures = {"captures": expected} if name.endswith("proxy") else {}
    assert access == {"models": expected, "data": expected, **captures}


@pytest.mark.unit
def test_every_pod_may_resolve_names(rendered):
    """Egress is denied by default: a pod that allow-dns does not select cannot resolve a Service name (a
    worker its peers, eval the server)."""
    _, docs, _ = rendered
    allow_dns = next(d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "allow-dns")
    selector = allow_dns["spec"]["podSelector"]["matchLabels"]
    for doc, template in pod_templates(docs):
        labels = template["metadata"].get("labels", {})
        assert selector.items() <= labels.items(), f"{doc['kind']} {doc['metadata']['name']}: pod labels {labels}"


@pytest.mark.unit
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


@pytest.mark.unit
def test_multi_worker_job_restarts_the_whole_group_from_a_shared_checkpoint():
    """A lost worker: its index is replaced, the survivors exit with WorkerLost's code and are replaced too,
    neither that echo nor a preemption spends the Job's budget, and every worker reaches the checkpoint."""
    from trainserve.training.cluster import WorkerLost

    docs = render("k8s/overlays/multi-worker")
    (job,) = (d for d in docs if d["kind"] == "Job" and d["metadata"]["name"] == "train-mw")
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and spec["podReplacementPolicy"] == "Failed"
    assert "backoffLimitPerIndex" not in spec, "one budget for the group: the workers succeed or fail together"
    ignored = [rule for rule in spec["podFailurePolicy"]["rules"] if rule["action"] == "Ignore"]
    assert {"containerName": "train", "operator": "In", "values": [WorkerLost.exit_code]} in [
        rule.get("onExitCodes") for rule in ignored
    ]
    assert [{"type": "DisruptionTarget", "status": "True"}] in [rule.get("onPodConditions") for rule in ignored]
    assert spec["successPolicy"] == {"rules": [{"succeededIndexes": "0"}]}, "done when the chief has published"
    (container,) = pod["containers"]
    backup = next(e["value"] for e in container["env"] if e["name"] == "TRAINSERVE_BACKUP_DIR")
    (mount,) = (m for m in container["volumeMounts"] if backup.startswith(m["mountPath"] + "/"))
    claim = next(v for v in pod["volumes"] if v["name"] == mount["name"])["persistentVolumeClaim"]["claimName"]
    (pvc,) = (d for d in docs if d["kind"] == "PersistentVolumeClaim" and d["metadata"]["name"] == claim)
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"], "every worker reads the chief's checkpoint"


def expand(text: str, env: dict[str, str]) -> str:
    """The kubelet's `$(VAR)` expansion in env values, command and args (unknown names stay as written)."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), text)


def resolved(docs: list[dict]) -> dict[str, dict]:
    """What each workload's container gets at run time, as the kubelet resolves it: env values (literal or
    from a ConfigMap key) and args with `$(VAR)` expanded. Keyed by workload name."""
    data = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    found = {}
    for doc, spec in pod_specs(docs):
        # The workload's own container (the proxy component adds a `capture` sidecar to serve-cpu's pods).
        (container,) = (c for c in spec["containers"] if c["name"] != "proxy")
        env = {}
        for var in container.get("env", []):
            if "value" in var:
                env[var["name"]] = expand(var["value"], env)
            elif "configMapKeyRef" in var["valueFrom"]:
                ref = var["valueFrom"]["configMapKeyRef"]
                env[var["name"]] = data[ref["name"]][ref["key"]]
        args = [expand(arg, env) for arg in container.get("args", [])]
        found[doc["metadata"]["name"]] = {"env": env, "args": args}
    return found


def assert_one_model(docs: list[dict], model: str) -> None:
    workloads = resolved(docs)
    assert workloads["serve-cpu"]["env"]["MODEL_NAME"] == model
    trainer = workloads.get("train") or workloads["train-mw"]
    assert trainer["env"]["TRAINSERVE_MODEL_NAME"] == model and trainer["env"]["TRAINSERVE_EXPORT_BASE"] == "/models"
    assert {f"--model={model}", "--data=held-out", "--data-dir=/data"} <= set(workloads["eval"]["args"])


@pytest.mark.unit
@pytest.mark.parametrize("overlay", KUSTOMIZATIONS[1:])
def test_the_model_name_is_set_once_per_overlay(overlay):
    text = subprocess.run(["kubectl", "kustomize", str(REPO / overlay)], capture_output=True, text=True).stdout
    assert text.count("digits") == 1, "only the trainserve-model ConfigMap names the model"
    docs = render(overlay)
    assert config_map(docs, "trainserve-model")["data"] == {"MODEL_NAME": "digits"}
    assert_one_model(docs, "digits")


@pytest.mark.unit
def test_the_model_name_is_declared_once_in_the_sources():
    """One kustomization declares MODEL_NAME; the overlays inherit it (a user's overlay merges its own)."""
    declaring = [
        str(path.relative_to(REPO))
        for path in sorted((REPO / "k8s").rglob("kustomization.yaml"))
        if re.search(r"^\s*literals: \[MODEL_NAME=", path.read_text(), re.M)
    ]
    assert declaring == ["k8s/base/kustomization.yaml"]


@pytest.mark.unit
def test_every_component_has_a_readme_saying_how_to_use_it():
    for component in sorted(p for p in (REPO / "k8s" / "components").iterdir() if p.is_dir()):
        readme = component / "README.md"
        assert readme.is_file(), f"{component.relative_to(REPO)}: no README.md"
        assert f"components/{component.name}" in readme.read_text(), f"{readme}: say how an overlay includes it"


@pytest.mark.unit
@pytest.mark.parametrize("overlay", KUSTOMIZATIONS[1:])
def test_another_model_name_reaches_training_serving_and_eval(overlay, tmp_path):
    """A user's overlay on top of ours sets MODEL_NAME once: no `digits` is left anywhere."""
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(REPO / overlay, tmp_path)],
                "configMapGenerator": [
                    {"name": "trainserve-model", "behavior": "merge", "literals": ["MODEL_NAME=cats"]}
                ],
            }
        )
    )
    require("kubectl", shutil.which("kubectl") is not None, "kubectl kustomize renders the manifests")
    proc = subprocess.run(["kubectl", "kustomize", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "digits" not in proc.stdout
    docs = [doc for doc in yaml.safe_load_all(proc.stdout) if doc]
    assert_one_model(docs, "cats")


def volume_path(spec: dict, container: dict, path: str) -> tuple[str, str, bool]:
    """Where `path` inside `container` lies: (PVC claim, path within the volume, writable)."""
    mount = max(
        (m for m in container["volumeMounts"] if path == m["mountPath"] or path.startswith(m["mountPath"] + "/")),
        key=lambda m: len(m["mountPath"]),
    )  # the innermost mount wins, as in the container
    (volume,) = (v for v in spec["volumes"] if v["name"] == mount["name"])
    claim = volume["persistentVolumeClaim"]
    inside = os.path.join(mount.get("subPath", ""), os.path.relpath(path, mount["mountPath"]))
    return claim["claimName"], os.path.normpath(inside), not (mount.get("readOnly") or claim.get("readOnly"))


def flag(container: dict, name: str) -> str:
    (value,) = (arg.split("=", 1)[1] for arg in container["args"] if arg.startswith(f"--{name}="))
    return value


@pytest.mark.unit
def test_promote_job_gates_a_rollout_with_least_privilege(rendered):
    """candidate -> eval of the candidate -> promote, run on demand from a suspended CronJob; the config it
    rewrites is the one serving polls, on the models volume; no Kubernetes API access, gRPC to serving only."""
    overlay, docs, _ = rendered
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    serving = serving_container(docs)
    serving_spec = by_kind[("Deployment", "serve-cpu")]["spec"]["template"]["spec"]
    served = {e["name"]: e.get("value") for e in serving["env"]}["ROLLOUT_CONFIG_FILE"]
    assert volume_path(serving_spec, serving, served)[2] is False, "serving reads the rollout config, never writes"
    assert not any(d["kind"] in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding") for d in docs)

    for name, steps in (("promote", ["candidate", "eval", "promote"]), ("rollback", ["rollback"])):
        cronjob = by_kind[("CronJob", name)]
        assert cronjob["spec"]["suspend"] is True, "`kubectl apply -k` never starts a promotion or a rollback"
        job = cronjob["spec"]["jobTemplate"]["spec"]
        spec = job["template"]["spec"]
        assert [c["name"] for c in all_containers(spec)] == steps
        assert spec["automountServiceAccountToken"] is False and spec["restartPolicy"] == "Never"
        account = by_kind[("ServiceAccount", spec["serviceAccountName"])]
        assert account["automountServiceAccountToken"] is False
        containers = {c["name"]: c for c in all_containers(spec)}
        # TensorFlow-free steps: the eval image, never the multi-GB training image.
        assert {c["image"].rpartition(":")[0] for c in containers.values()} == {"trainserve/eval"}
        for step in set(steps) - {"eval"}:
            container = containers[step]
            assert container["command"] == ["trainserve"] and container["args"][0] == step
            # The same file as serving's: same claim, same path in it; writable here, the versions are not.
            config = flag(container, "config")
            assert volume_path(spec, container, config) == (*volume_path(serving_spec, serving, served)[:2], True)
            assert volume_path(spec, container, "/models/x/1")[2] is False, "the versions stay read-only"
            assert flag(container, "server") == "serve-cpu:8500"
        # Only serving's gRPC port, and serving admits these pods.
        labels = job["template"]["metadata"]["labels"]
        egress = [
            rule
            for d in docs
            if d["kind"] == "NetworkPolicy"
            and "Egress" in d["spec"]["policyTypes"]
            and d["spec"]["podSelector"].get("matchLabels", {}).items() <= labels.items()
            for rule in d["spec"].get("egress", [])
        ]
        to_serving = [
            r
            for r in egress
            if r["to"][0].get("podSelector", {}).get("matchLabels") == {"app.kubernetes.io/name": "serve-cpu"}
        ]
        # (with the proxy component, its sidecar's gRPC port too: the Service sends calls through it)
        assert [p["port"] for r in to_serving for p in r["ports"]] == [8500] + ([8510] if "proxy" in overlay else [])
        dns = [r for r in egress if {p["port"] for p in r["ports"]} == {53}]
        # (with progressive delivery, promote's `candidate` asks the rollout's Prometheus whether the proxy follows)
        asks_prometheus = name == "promote" and "proxy" in overlay
        to_prometheus = [r for r in egress if asks_prometheus and r["ports"] == [{"protocol": "TCP", "port": 9090}]]
        assert bool(to_prometheus) == asks_prometheus
        assert dns and all(r in to_serving + dns + to_prometheus for r in egress), "serve-cpu by name, then gRPC only"
        ingress = by_kind[("NetworkPolicy", "serve-cpu-from-clients")]["spec"]["ingress"][0]
        assert ingress["from"][0]["podSelector"]["matchLabels"].items() <= labels.items()

    spec = by_kind[("CronJob", "promote")]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    steps = {c["name"]: c for c in all_containers(spec)}
    # The gate evaluates the candidate on the real server, and promote reads exactly the report it wrote.
    assert flag(steps["eval"], "label") == "candidate" and flag(steps["eval"], "server") == "serve-cpu:8500"
    assert float(flag(steps["eval"], "min-accuracy")) > 0
    assert flag(steps["eval"], "report") == flag(steps["promote"], "report")
    assert volume_path(spec, steps["eval"], flag(steps["eval"], "report"))[2]
    assert flag(steps["candidate"], "model") == "$(MODEL_NAME)" == flag(steps["eval"], "model")
    # A failed gate ends the Job at once: a retry would evaluate the same candidate again.
    rules = by_kind[("CronJob", "promote")]["spec"]["jobTemplate"]["spec"]["podFailurePolicy"]["rules"]
    assert {"action": "FailJob", "onExitCodes": {"containerName": "eval", "operator": "In", "values": [1]}} in rules


# --- gRPC over mutual TLS (k8s/components/tls, tls-cert-manager) ---------------------------------------------

TLS_SECRETS = {"serve-cpu-tls", "trainserve-client-tls"}


def secret_mounts(spec: dict, container: dict) -> dict[str, dict]:
    """secretName -> the container's mount of it."""
    secrets = {v["name"]: v["secret"]["secretName"] for v in spec.get("volumes", []) if "secret" in v}
    return {secrets[m["name"]]: m for m in container.get("volumeMounts", []) if m["name"] in secrets}


@pytest.mark.unit
def test_tls_mounts_the_server_secret_read_only_and_gives_every_client_a_certificate():
    docs = render("k8s/overlays/tls")
    env = config_map(docs, "trainserve-client-tls")["data"]
    for _, spec in pod_specs(docs):
        for container in all_containers(spec):
            mounts = secret_mounts(spec, container)
            assert all(m.get("readOnly") for m in mounts.values()), f"{container['name']}: a writable Secret"
            if container["name"] == "serve-cpu":
                tls_dir = next(e["value"] for e in container["env"] if e["name"] == "TRAINSERVE_TLS_DIR")
                assert mounts["serve-cpu-tls"]["mountPath"] == tls_dir and set(mounts) == {"serve-cpu-tls"}
            elif any(arg.startswith("--server=") for arg in container.get("args", [])):
                # Every client of the server: the client Secret's files are where TRAINSERVE_TLS_* say.
                assert set(mounts) == {"trainserve-client-tls"}, container["name"]
                client_dir = mounts["trainserve-client-tls"]["mountPath"]
                assert {env[f"TRAINSERVE_TLS_{k}"] for k in ("CA", "CERT", "KEY")} == {
                    f"{client_dir}/{f}" for f in ("ca.crt", "tls.crt", "tls.key")
                }
                refs = [e["configMapRef"]["name"] for e in container["envFrom"]]
                assert config_map(docs, "trainserve-client-tls")["metadata"]["name"] in refs
            else:
                assert not mounts, f"{container['name']} talks to no server: no certificate"
    clients = {c["name"] for _, spec in pod_specs(docs) for c in all_containers(spec) if "envFrom" in c}
    assert clients == {"eval", "candidate", "promote", "rollback"}


@pytest.mark.unit
def test_tls_serving_probes_need_no_client_certificate():
    """client_verify refuses every gRPC connection without a certificate, and a probe presents none: the probes
    ask healthcheck.sh, over the REST port, which TLS leaves plaintext (as TF Serving does)."""
    container = serving_container(render("k8s/overlays/tls"))
    for probe in ("readinessProbe", "livenessProbe"):
        assert "grpc" not in container[probe] and container[probe]["exec"]["command"][0].endswith("healthcheck.sh")
    healthcheck = (SERVE_CPU / "healthcheck.sh").read_text()
    assert "/dev/tcp/127.0.0.1/${REST_PORT:-8501}" in healthcheck and "GRPC_PORT" not in healthcheck


@pytest.mark.unit
def test_cert_manager_issues_the_secrets_the_tls_component_mounts(tmp_path):
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "namespace": "trainserve",  # as the README's overlay: the Certificates join the Secrets' namespace
                "resources": [os.path.relpath(REPO / "k8s/overlays/tls", tmp_path)],
                "components": [os.path.relpath(REPO / "k8s/components/tls-cert-manager", tmp_path)],
            }
        )
    )
    require("kubectl", shutil.which("kubectl") is not None, "kubectl kustomize renders the manifests")
    proc = subprocess.run(["kubectl", "kustomize", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    docs = [doc for doc in yaml.safe_load_all(proc.stdout) if doc]
    certificates = {d["spec"]["secretName"]: d["spec"] for d in docs if d["kind"] == "Certificate"}
    assert set(certificates) >= TLS_SECRETS
    assert (
        "serve-cpu" in certificates["serve-cpu-tls"]["dnsNames"]
        and "server auth" in certificates["serve-cpu-tls"]["usages"]
    )
    assert "client auth" in certificates["trainserve-client-tls"]["usages"]
    issuers = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Issuer"}
    assert {c["issuerRef"]["name"] for c in certificates.values()} <= set(issuers)
    assert all(d["metadata"]["namespace"] == "trainserve" for d in docs if d["kind"] in ("Certificate", "Issuer"))
