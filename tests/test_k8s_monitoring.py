"""k8s/components/monitoring: rendered on the base, its PodMonitor and PrometheusRule valid against the Prometheus
Operator's CRD schemas (vendored in k8s/schemas, kubeconform's layout and strictness), the PrometheusRule the same
rules as monitoring/rules.yml, and the PodMonitor aimed at the port and path serving exposes its metrics on, and,
with the proxy sidecar, at the sidecar's as the job `trainserve rollout` reads the proxy's counts from."""

from __future__ import annotations

import copy
import importlib.util
import json
import os

import jsonschema
import pytest
import yaml
from test_k8s import render

from conftest import REPO
from trainserve.proxy.config import ProxyConfig
from trainserve.rollout.rollout_config import RolloutConfig
from trainserve.serving.config import parse_monitoring

pytestmark = pytest.mark.unit  # kubectl runs as a subprocess; nothing imports TensorFlow
SCHEMAS = REPO / "k8s" / "schemas"
COMPONENT = REPO / "k8s" / "components" / "monitoring"


def validate(doc: dict) -> None:
    """Against the vendored schema kubeconform would pick ({group}/{kind}_{version}.json). The schemas' patterns are
    Go regular expressions (`^(?i)...`), which Python's `re` refuses when the metaschema checks them: kubeconform does
    not check the schema either, and a pattern is compiled only where a document has that field."""
    group, version = doc["apiVersion"].split("/")
    schema = json.loads((SCHEMAS / group / f"{doc['kind'].lower()}_{version}.json").read_text())
    jsonschema.Draft7Validator(schema).validate(doc)


def with_monitoring(tmp_path_factory, overlay: str) -> list[dict]:
    """`overlay` with the component, as README.md here tells a user to include it."""
    directory = tmp_path_factory.mktemp("overlay")
    (directory / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "namespace": "trainserve",  # the component's resources join serving's namespace
                "resources": [os.path.relpath(REPO / "k8s/overlays" / overlay, directory)],
                "components": [os.path.relpath(COMPONENT, directory)],
            }
        )
    )
    return render(str(directory))


@pytest.fixture(scope="module", name="docs")
def docs_fixture(tmp_path_factory) -> list[dict]:
    """The local overlay with the component."""
    return with_monitoring(tmp_path_factory, "local")


def custom(docs: list[dict], kind: str) -> dict:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


@pytest.mark.parametrize("kind", ["PodMonitor", "PrometheusRule"])
def test_custom_resources_validate_against_the_operator_schemas(docs, kind):
    doc = custom(docs, kind)
    validate(doc)
    assert doc["metadata"]["namespace"] == custom(docs, "Deployment")["metadata"]["namespace"], "beside serving"


@pytest.mark.parametrize(
    "kind, spoil",
    [
        pytest.param("PodMonitor", lambda s: s.update(podMetricEndpoints=s.pop("podMetricsEndpoints")), id="typo"),
        pytest.param("PrometheusRule", lambda s: s["groups"][0]["rules"][0].update(fire="always"), id="unknown-field"),
        pytest.param("PrometheusRule", lambda s: s["groups"][0].pop("name"), id="group-without-name"),
    ],
)
def test_the_schemas_reject_a_spoilt_resource(docs, kind, spoil):
    doc = copy.deepcopy(custom(docs, kind))
    spoil(doc["spec"])
    with pytest.raises(jsonschema.ValidationError):
        validate(doc)


def test_prometheus_rule_is_the_rules_file_and_up_to_date(docs):
    spec = importlib.util.spec_from_file_location("prometheus_rule", REPO / "scripts" / "prometheus_rule.py")
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    rules = (REPO / "monitoring" / "rules.yml").read_text()
    assert custom(docs, "PrometheusRule")["spec"]["groups"] == yaml.safe_load(rules)["groups"]
    committed = (COMPONENT / "prometheusrule.yaml").read_text()
    assert committed == generator.prometheus_rule(rules), "monitoring/rules.yml changed: run `make monitoring-rules`"


def test_pod_monitor_scrapes_the_serving_pods_where_they_serve_metrics(docs):
    monitor = custom(docs, "PodMonitor")["spec"]
    template = custom(docs, "Deployment")["spec"]["template"]
    labels = template["metadata"]["labels"]
    assert monitor["selector"]["matchLabels"].items() <= labels.items()
    endpoint, sidecar = monitor["podMetricsEndpoints"]
    assert sidecar["port"] not in {p["name"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
    ports = {p["name"]: p["containerPort"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
    assert endpoint["port"] in ports
    assert template["metadata"]["annotations"]["prometheus.io/port"] == str(ports[endpoint["port"]])
    served = parse_monitoring(str(REPO / "images" / "serve-cpu" / "monitoring.config"))
    assert endpoint["path"] == served == template["metadata"]["annotations"]["prometheus.io/path"]


def test_pod_monitor_scrapes_the_capture_sidecar_as_the_job_the_rollout_reads(tmp_path_factory):
    """With the capture and progressive-delivery components (k8s/overlays/proxy): the sidecar's REST port, at the
    path the proxy serves its counts on, as the job `trainserve rollout --proxy-job` reads by default, and reachable
    from Prometheus' namespace."""
    docs = with_monitoring(tmp_path_factory, "proxy")
    assert any(d["kind"] == "CronJob" and d["metadata"]["name"] == "rollout" for d in docs)  # the rollout is there
    monitor = custom(docs, "PodMonitor")["spec"]
    template = custom(docs, "Deployment")["spec"]["template"]
    (sidecar,) = [c for c in template["spec"]["containers"] if c["name"] == "proxy"]
    rest_port = {e["name"]: e["value"] for e in sidecar["env"]}["TRAINSERVE_REST_PORT"]
    (port,) = [p for p in sidecar["ports"] if str(p["containerPort"]) == rest_port]
    (endpoint,) = [e for e in monitor["podMetricsEndpoints"] if e["port"] == port["name"]]
    assert endpoint["path"] == ProxyConfig.__dataclass_fields__["metrics_path"].default
    jobs = [r["replacement"] for r in endpoint["relabelings"] if r["targetLabel"] == "job"]
    assert jobs == [RolloutConfig.__dataclass_fields__["proxy_job"].default] == ["proxy"]
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "serve-cpu-from-clients"]
    from_monitoring = [
        rule
        for rule in policy["spec"]["ingress"]
        if any(
            f.get("namespaceSelector", {}).get("matchLabels", {}).get("kubernetes.io/metadata.name") == "monitoring"
            for f in rule["from"]
        )
    ]
    assert any({"protocol": "TCP", "port": port["name"]} in rule["ports"] for rule in from_monitoring)
    validate(custom(docs, "PodMonitor"))
