"""The rules and the dashboard against a real Prometheus scraping a real serve-local: two versions serving (stable
and canary) with batching on, a third whose load failed, clients asking both and sending a malformed request now
and then. Every recording rule, every alert's expression and every dashboard query must read metrics that exist
and return series with the labels their readers (the dashboard's legends, the alerts' summaries) name."""

from __future__ import annotations

import json
import re
import threading

import numpy as np
import pytest
import yaml

from conftest import MONITORING as MONITORING_CONFIG
from conftest import ServeLocal, install_version
from prometheus_server import MONITORING, Prometheus, assert_series, with_bool
from trainserve.model_server_config import render_model_config, single_model_config

pytestmark = pytest.mark.integration  # serve-local and prometheus are subprocesses
RULES = yaml.safe_load((MONITORING / "rules.yml").read_text())["groups"]
RECORDS = {r["record"]: r["expr"] for group in RULES for r in group["rules"] if "record" in r}
ALERTS = {r["alert"]: r for group in RULES for r in group["rules"] if "alert" in r}
DASHBOARD = json.loads((MONITORING / "grafana" / "trainserve-serving.json").read_text())
IMAGES = np.random.default_rng(5).integers(0, 256, (4, 8, 8, 1), dtype=np.uint8).tolist()
BATCHING = "max_batch_size { value: 64 }\nbatch_timeout_micros { value: 1000 }\nnum_batch_threads { value: 2 }\n"


def dashboard_targets() -> list[tuple[str, str, str]]:
    """(panel title, expression with the `model` variable at All, legend) for every query on the dashboard."""
    return [
        (panel["title"], target["expr"].replace("$model", ".+"), target["legendFormat"])
        for panel in DASHBOARD["panels"]
        for target in panel.get("targets", [])
    ]


def by_labels(expr: str) -> set[str]:
    """The labels an aggregation keeps (`by (...)`), the histogram's `le` aside."""
    match = re.search(r"\bby \(([^)]*)\)", expr)
    return {label.strip() for label in match.group(1).split(",")} - {"le"} if match else set()


def traffic(server: ServeLocal, stop: threading.Event) -> None:
    """What clients do while Prometheus watches: both versions asked, and now and then a malformed request (a
    client error, counted under the version it named)."""
    sent = 0
    while not stop.is_set():
        for version in (1, 2):
            server.post(f"/v1/models/m/versions/{version}:predict", {"instances": IMAGES})
        sent += 1
        if sent % 5 == 0:
            server.post("/v1/models/m/versions/1:predict", {"instances": [{"no_such_input": 1}]})
        stop.wait(0.05)


@pytest.fixture(scope="module", name="prometheus")
def prometheus_fixture(model_versions, tmp_path_factory):
    root = tmp_path_factory.mktemp("monitoring")
    base = root / "models" / "m"
    install_version(model_versions[0], base, 1)
    install_version(model_versions[1], base, 2)
    (base / "3").mkdir()
    (base / "3" / "saved_model.pb").write_bytes(b"not a SavedModel")  # its load fails: END, error UNKNOWN
    config = single_model_config("m", str(base))
    entry = config.model_config_list.config[0]
    entry.model_version_policy.all.SetInParent()
    entry.version_labels.update({"stable": 1, "canary": 2})
    (root / "models.config").write_text(render_model_config(config))
    (root / "monitoring.config").write_text(MONITORING_CONFIG)
    (root / "batching.config").write_text(BATCHING)
    server = ServeLocal(
        f"--model_config_file={root / 'models.config'}",
        f"--monitoring_config_file={root / 'monitoring.config'}",
        "--enable_batching",
        f"--batching_parameters_file={root / 'batching.config'}",
        "--allow_version_labels_for_unavailable_models",
        log_path=root / "serve-local.log",
    )
    stop, prometheus = threading.Event(), None
    sender = threading.Thread(target=traffic, args=(server, stop), daemon=True)
    try:
        for version in (1, 2):
            server.wait_available("m", version)
        server.wait_for(lambda: server.versions("m").get(3) == "END", "version 3's failed load")
        sender.start()
        prometheus = Prometheus(root, server.rest.removeprefix("http://"))
        prometheus.wait_for(
            lambda: (
                [s["value"][1] for s in prometheus.query('count_over_time(up{job="serve-local"}[1m])')] >= ["5"]
                and [s["value"][1] for s in prometheus.query('up{job="serve-local"}')] == ["1"]
            ),
            "five scrapes of serve-local, the last one up",
        )
        yield prometheus
    finally:
        stop.set()
        if sender.is_alive():
            sender.join(timeout=30)
        if prometheus is not None:
            prometheus.stop()
        server.stop()


@pytest.mark.parametrize("record", sorted(RECORDS))
def test_recording_rule_returns_series_per_its_labels(prometheus, record):
    labels = by_labels(RECORDS[record])
    assert_series(prometheus, RECORDS[record], labels)
    series = assert_series(prometheus, record + "{}", labels)  # and Prometheus itself records it
    if "version" in labels:
        assert {s["metric"]["version"] for s in series} >= {"1", "2"}, "stable and canary apart"


@pytest.mark.parametrize("alert", sorted(ALERTS))
def test_alert_expression_watches_series_with_the_labels_its_summary_names(prometheus, alert):
    rule = ALERTS[alert]
    labels = set(re.findall(r"\$labels\.(\w+)", rule["annotations"]["summary"]))
    assert labels, f"{alert}: its summary names no label"
    assert_series(prometheus, with_bool(rule["expr"]), labels)


@pytest.mark.parametrize("panel, expr, legend", dashboard_targets(), ids=lambda v: v if len(v) < 40 else None)
def test_dashboard_query_returns_the_labels_its_legend_names(prometheus, panel, expr, legend):
    del panel
    assert_series(prometheus, expr, set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend)))


def test_dashboard_model_variable_lists_the_served_model(prometheus):
    (variable,) = [v for v in DASHBOARD["templating"]["list"] if v["name"] == "model"]
    metric, label = re.fullmatch(r"label_values\(([^,]+), (\w+)\)", variable["query"]["query"]).groups()
    assert prometheus.api(f"label/{label}/values", **{"match[]": metric}) == ["m"]


def test_version_state_shows_the_failed_load(prometheus):
    series = assert_series(prometheus, ":trainserve:serve_local:version_state{}", {"version", "state", "error_code"})
    states = {(s["metric"]["version"], s["metric"]["state"], s["metric"]["error_code"]) for s in series}
    assert states == {("1", "AVAILABLE", "OK"), ("2", "AVAILABLE", "OK"), ("3", "END", "UNKNOWN")}


@pytest.mark.parametrize(
    "expr, message",
    [
        pytest.param("rate(:tensorflow:serving:request_cont{}[5m])", "does not have", id="misspelt-metric"),
        pytest.param("trainserve:predict_requests:rate5m{} > 1e9", "timed out", id="no-series"),
        pytest.param(
            "sum by (model_name) (trainserve:predict_requests:rate5m{})", "without", id="label-aggregated-away"
        ),
    ],
)
def test_a_query_that_reads_nothing_fails(prometheus, expr, message):
    """The checks above can fail: a metric that does not exist, a query with no series, a label the legend names
    but the query drops."""
    with pytest.raises(AssertionError, match=message):
        assert_series(prometheus, expr, {"model_name", "version"}, timeout=3)
