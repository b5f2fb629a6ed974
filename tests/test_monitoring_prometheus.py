"""The rules and the dashboard against a real Prometheus scraping a real serve-local and the proxy in front
of it: two versions serving (stable and canary) with batching on, a third whose load failed, clients asking both
and sending a malformed request now and then, and clients of the proxy asking `stable`, which the proxy's routing
answers from stable or the canary and shadows to the canary. Every recording rule, every alert's expression and
every dashboard query must read metrics that exist and return series with the labels their readers (the
dashboard's legends, the alerts' summaries) name."""

from __future__ import annotations

import pytest

from conftest import MONITORING as MONITORING_CONFIG
from conftest import ServeLocal
from prometheus_server import (
    ALERTS,
    RECORDS,
    assert_series,
    check_alert,
    check_dashboard_query,
    check_model_variable,
    check_record,
    check_version_state,
    dashboard_targets,
    watched_model,
    watching,
)
from serving_fixtures import NO_LATENCY_SHED

# serve-local and prometheus are subprocesses; one worker runs the module, so they start once (see conftest.py)
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("monitoring")]
BATCHING = "max_batch_size { value: 64 }\nbatch_timeout_micros { value: 1000 }\nnum_batch_threads { value: 2 }\n"


@pytest.fixture(scope="module", name="prometheus")
def prometheus_fixture(model_versions, tmp_path_factory):
    root = tmp_path_factory.mktemp("monitoring")
    models_config = watched_model(root, model_versions, str(root / "models" / "m"))
    (root / "monitoring.config").write_text(MONITORING_CONFIG)
    (root / "batching.config").write_text(BATCHING)
    server = ServeLocal(
        f"--model_config_file={models_config}",
        f"--monitoring_config_file={root / 'monitoring.config'}",
        "--enable_batching",
        f"--batching_parameters_file={root / 'batching.config'}",
        "--allow_version_labels_for_unavailable_models",
        log_path=root / "serve-local.log",
    )
    proxy = None
    try:
        proxy = routing_proxy(server, root)
        with watching(server, root, server.rest.removeprefix("http://"), proxy=proxy) as prometheus:
            yield prometheus
    finally:
        if proxy is not None:
            proxy.stop(5)
        server.stop()


def routing_proxy(server, root):
    """The proxy in front of `server`, in this process: 30 % of `stable` (1) answered by the canary (2),
    every stable answer shadowed to it, every call captured."""
    from trainserve.proxy.config import ProxyConfig
    from trainserve.proxy.routing import ModelRoute, Routing, write_routing
    from trainserve.proxy.server import Proxy

    routing = write_routing(root / "routing.json", Routing({"m": ModelRoute(2, shadow_percent=100, canary_percent=30)}))
    config = ProxyConfig(
        upstream=server.target,
        upstream_rest=server.rest.removeprefix("http://"),
        port=0,
        rest_port=0,
        filename_prefix=str(root / "captures" / "m"),
        routing_file=routing,
        **NO_LATENCY_SHED,
    )
    return Proxy(config)


@pytest.mark.parametrize("record", sorted(RECORDS))
def test_recording_rule_returns_series_per_its_labels(prometheus, record):
    check_record(prometheus, record)


@pytest.mark.parametrize("alert", sorted(ALERTS))
def test_alert_expression_watches_series_with_the_labels_its_summary_names(prometheus, alert):
    check_alert(prometheus, alert)


@pytest.mark.parametrize("panel, expr, legend", dashboard_targets(), ids=lambda v: v if len(v) < 40 else None)
def test_dashboard_query_returns_the_labels_its_legend_names(prometheus, panel, expr, legend):
    del panel
    check_dashboard_query(prometheus, expr, legend)


def test_dashboard_model_variable_lists_the_served_model(prometheus):
    check_model_variable(prometheus)


def test_version_state_shows_the_failed_load(prometheus):
    check_version_state(prometheus)


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
