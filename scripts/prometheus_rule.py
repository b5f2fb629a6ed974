"""Write k8s/components/monitoring/prometheusrule.yaml from monitoring/rules.yml: the same groups, as the
Prometheus Operator's PrometheusRule, so one rules file feeds plain Prometheus, compose and Kubernetes.

    python scripts/prometheus_rule.py [OUT]      # `make monitoring-rules`; tests check OUT is up to date
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
RULES = REPO / "monitoring" / "rules.yml"
OUT = REPO / "k8s" / "components" / "monitoring" / "prometheusrule.yaml"
HEADER = "# GENERATED from monitoring/rules.yml by `make monitoring-rules`: edit that file, not this one.\n"


def prometheus_rule(rules_text: str) -> str:
    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "trainserve-serving",
            "labels": {"app.kubernetes.io/name": "trainserve-serving", "app.kubernetes.io/component": "monitoring"},
        },
        "spec": {"groups": yaml.safe_load(rules_text)["groups"]},
    }
    return HEADER + yaml.safe_dump(rule, sort_keys=False, width=120)


if __name__ == "__main__":
    if len(sys.argv) > 2 or sys.argv[1:2] in (["-h"], ["--help"]):
        sys.exit(__doc__)
    out = Path(sys.argv[1]) if len(sys.argv) == 2 else OUT
    out.write_text(prometheus_rule(RULES.read_text()))
