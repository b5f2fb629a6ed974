"""A real Prometheus (Debian's `prometheus`) for the tests: its own data directory and free port, one of the
repository's scrape configs pointed at a test's server, started and stopped by pid; the model it watches (two
versions serving, stable and canary, and a third whose load failed) and the traffic it sees; and the checks that
every recording rule, alert expression and dashboard query reads metrics that exist and returns series with the
labels its reader expects. tests/test_monitoring_prometheus.py runs them against serve-local,
tests/test_e2e_monitoring_docker.py against the serve-cpu image."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import numpy as np
import yaml

from conftest import DIRECT, REPO, free_port, install_version, require
from trainserve.model_server_config import render_model_config, single_model_config

MONITORING = REPO / "monitoring"
RULES = yaml.safe_load((MONITORING / "rules.yml").read_text())["groups"]
RECORDS = {r["record"]: r["expr"] for group in RULES for r in group["rules"] if "record" in r}
ALERTS = {r["alert"]: r for group in RULES for r in group["rules"] if "alert" in r}
DASHBOARD = json.loads((MONITORING / "grafana" / "trainserve-serving.json").read_text())
IMAGES = np.random.default_rng(5).integers(0, 256, (4, 8, 8, 1), dtype=np.uint8).tolist()
# A metric selector: a name followed by its braces (monitoring/rules.yml writes every selector so).
SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{")
COMPARISON = re.compile(r"(==|!=|>=|<=|>|<)(?!\s*bool\b)")


class Prometheus:
    """`prometheus` scraping `target` every second with the job and rules of `config`: monitoring/prometheus.yml
    (job serve-local) or prometheus-compose.yml (job serve-cpu), its one target replaced by `target`."""

    def __init__(
        self,
        directory: Path,
        target: str,
        config_file: str = "prometheus.yml",
        proxy: str | list[str] | None = None,
        interval: str = "1s",
        other_jobs: dict[str, str] | None = None,
    ):
        """`proxy`: the proxy's REST address (or its replicas'), scraped as the config's `proxy` job (left
        out without); `interval`: of the scrapes and the rules' evaluation; `other_jobs`: more proxies, each
        scraped as the proxy job is but under its own job name (name -> REST address)."""
        require("prometheus", shutil.which("prometheus") is not None, "Debian's prometheus package")
        config = yaml.safe_load((MONITORING / config_file).read_text())
        config["global"].update(scrape_interval=interval, evaluation_interval=interval)
        config["rule_files"] = [str(MONITORING / name) for name in config["rule_files"]]
        scrape, *others = config["scrape_configs"]
        (proxy_scrape,) = [s for s in others if s["job_name"] == "proxy"]
        config["scrape_configs"] = [scrape] + ([proxy_scrape] if proxy else [])
        for job, addresses in ((scrape, [target]), (proxy_scrape, [proxy] if isinstance(proxy, str) else proxy)):
            (static,) = job["static_configs"]
            static["targets"] = addresses
        for name, address in (other_jobs or {}).items():
            config["scrape_configs"].append(
                {**proxy_scrape, "job_name": name, "static_configs": [{"targets": [address]}]}
            )
        self.job = scrape["job_name"]
        (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.url = f"http://127.0.0.1:{free_port()}"
        self._log = open(directory / "prometheus.log", "w")  # noqa: SIM115  (closed in stop())
        self.proc = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={directory / 'prometheus.yml'}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address={self.url.removeprefix('http://')}",
                "--log.level=warn",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.log_path = directory / "prometheus.log"

    def api(self, path: str, **params: str) -> dict:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        body = json.loads(DIRECT.open(url, timeout=30).read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        return self.api("query", query=expr)["result"]

    def wait_for(self, predicate, what: str, timeout: float = 120) -> None:
        """Polls until `predicate()` holds: the event itself, bounded generously, never a fixed sleep."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"prometheus exited:\n{self.log_path.read_text()}"
            try:
                if predicate():
                    return
            except OSError:  # not listening yet
                pass
            time.sleep(0.2)
        raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{self.log_path.read_text()[-3000:]}")

    def wait_scraped(self, scrapes: int = 5) -> None:
        """`scrapes` scrapes of the target, the last one up: enough samples for the rules' rates."""
        count, up = f'count_over_time(up{{job="{self.job}"}}[1m])', f'up{{job="{self.job}"}}'
        self.wait_for(
            lambda: (
                [float(s["value"][1]) >= scrapes for s in self.query(count)] == [True]
                and [s["value"][1] for s in self.query(up)] == ["1"]
            ),
            f"{scrapes} scrapes of {self.job}, the last one up",
        )

    def metric_names(self) -> set[str]:
        return set(self.api("label/__name__/values"))

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def with_bool(expr: str) -> str:
    """An alert's expression with its comparisons made `bool`: the series it watches, 0 or 1, even while it does not
    fire. Label matchers (inside braces) and strings are left alone."""
    pieces, start = [], 0
    for match in re.finditer(r'\{[^}]*\}|"(?:\\.|[^"\\])*"', expr):
        pieces.append(COMPARISON.sub(r"\1 bool", expr[start : match.start()]))
        pieces.append(match.group(0))
        start = match.end()
    pieces.append(COMPARISON.sub(r"\1 bool", expr[start:]))
    return "".join(pieces)


def assert_series(prometheus: Prometheus, expr: str, labels: set[str], timeout: float = 60) -> list[dict]:
    """`expr` names only metrics Prometheus has, and returns series, each carrying every one of `labels`."""
    names = set(SELECTOR.findall(expr))
    assert names, f"no metric selector in {expr!r}"
    missing = names - prometheus.metric_names()
    assert not missing, f"{expr!r} names metrics Prometheus does not have: {sorted(missing)}"
    found: list[dict] = []

    def returns_series() -> bool:
        found[:] = prometheus.query(expr)
        return bool(found)

    prometheus.wait_for(returns_series, f"series from {expr!r}", timeout)
    for series in found:
        absent = {label for label in labels if not series["metric"].get(label)}
        assert not absent, f"{expr!r}: a series without {sorted(absent)}: {series['metric']}"
    return found


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


def watched_model(root: Path, versions: list[Path], base_path: str) -> Path:
    """Model `m` under `root/models/m`: versions 1 and 2 (labels stable and canary) and a version 3 whose load fails
    (END, error UNKNOWN), all served (`model_version_policy { all {} }`); `root/models.config` names the model's
    directory as the server sees it (`base_path`). Returns the config's path."""
    base = root / "models" / "m"
    install_version(versions[0], base, 1)
    install_version(versions[1], base, 2)
    (base / "3").mkdir()
    (base / "3" / "saved_model.pb").write_bytes(b"not a SavedModel")
    config = single_model_config("m", base_path)
    entry = config.model_config_list.config[0]
    entry.model_version_policy.all.SetInParent()
    entry.version_labels.update({"stable": 1, "canary": 2})
    (root / "models.config").write_text(render_model_config(config))
    return root / "models.config"


def traffic(server, stop: threading.Event) -> None:
    """What clients do while Prometheus watches `server` (anything with the tests' `post`): both versions asked,
    and now and then a malformed request (a client error, counted under the version it named)."""
    sent = 0
    while not stop.is_set():
        for version in (1, 2):
            server.post(f"/v1/models/m/versions/{version}:predict", {"instances": IMAGES})
        sent += 1
        if sent % 5 == 0:
            server.post("/v1/models/m/versions/1:predict", {"instances": [{"no_such_input": 1}]})
        stop.wait(0.05)


def proxy_traffic(target: str, stop: threading.Event) -> None:
    """Clients of the proxy at `target` (gRPC): Predict calls addressed to `stable`, which its routing
    answers from stable or the canary and shadows to the canary."""
    import grpc

    from trainserve.protos import predict_pb2
    from trainserve.tensors import to_tensor_proto

    request = predict_pb2.PredictRequest()
    request.model_spec.name, request.model_spec.version_label = "m", "stable"
    to_tensor_proto(np.array(IMAGES, np.uint8), into=request.inputs["images"])
    with grpc.insecure_channel(target) as channel:
        predict = channel.unary_unary("/tensorflow.serving.PredictionService/Predict", lambda r: r.SerializeToString())
        while not stop.is_set():
            with contextlib.suppress(grpc.RpcError):  # a canary's error is a series too
                predict(request, timeout=30)
            stop.wait(0.05)


@contextlib.contextmanager
def watching(server, root: Path, target: str, config_file: str = "prometheus.yml", proxy=None):
    """A real Prometheus scraping `server` at `target` once versions 1 and 2 serve, version 3 has failed to load
    and clients are sending traffic; with `proxy` (a started trainserve.proxy.server.Proxy in front of
    `server`), scraping it too while clients call it; stopped, and the traffic with it, on leaving."""
    stop, prometheus = threading.Event(), None
    senders = [threading.Thread(target=traffic, args=(server, stop), daemon=True)]
    if proxy is not None:
        senders.append(threading.Thread(target=proxy_traffic, args=(f"127.0.0.1:{proxy.port}", stop), daemon=True))
    try:
        for version in (1, 2):
            server.wait_available("m", version)
        server.wait_for(lambda: server.versions("m").get(3) == "END", "version 3's failed load")
        for sender in senders:
            sender.start()
        scraped_proxy = f"127.0.0.1:{proxy.rest_port}" if proxy is not None else None
        prometheus = Prometheus(root, target, config_file, scraped_proxy)
        prometheus.wait_scraped()
        yield prometheus
    finally:
        stop.set()
        for sender in senders:
            if sender.is_alive():
                sender.join(timeout=30)
        if prometheus is not None:
            prometheus.stop()


def reads_proxy(expr: str) -> bool:
    """Whether an expression reads what only the proxy exports (its counts, its capture writer's)."""
    proxy_only = (":trainserve:proxy:", ":trainserve:capture:", "trainserve:proxy", "trainserve:shadow")
    return any(name.startswith((*proxy_only, "trainserve:capture")) for name in SELECTOR.findall(expr))


def check_record(prometheus: Prometheus, record: str) -> None:
    """The rule's expression returns series per the labels it keeps, Prometheus records it, stable and canary apart
    (shadow series: the candidate's, version 2, alone)."""
    labels = by_labels(RECORDS[record])
    assert_series(prometheus, RECORDS[record], labels)
    series = assert_series(prometheus, record + "{}", labels)
    if "version" in labels:
        expected = {"2"} if ":shadow_" in RECORDS[record] else {"1", "2"}
        assert {s["metric"]["version"] for s in series} >= expected, f"{record}: stable and canary apart"


def check_alert(prometheus: Prometheus, alert: str) -> None:
    """The alert's expression (made `bool`) watches series carrying the labels its summary names."""
    rule = ALERTS[alert]
    labels = set(re.findall(r"\$labels\.(\w+)", rule["annotations"]["summary"]))
    assert labels, f"{alert}: its summary names no label"
    assert_series(prometheus, with_bool(rule["expr"]), labels)


def check_dashboard_query(prometheus: Prometheus, expr: str, legend: str) -> None:
    """A dashboard query returns series carrying the labels its legend names."""
    assert_series(prometheus, expr, set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend)))


def check_model_variable(prometheus: Prometheus) -> None:
    """The dashboard's `model` variable lists the served model."""
    (variable,) = [v for v in DASHBOARD["templating"]["list"] if v["name"] == "model"]
    metric, label = re.fullmatch(r"label_values\(([^,]+), (\w+)\)", variable["query"]["query"]).groups()
    values = prometheus.api(f"label/{label}/values", **{"match[]": metric})
    assert values == ["m"], f"{variable['query']['query']}: {values}"


def check_version_state(prometheus: Prometheus) -> None:
    """Versions 1 and 2 AVAILABLE, version 3's failed load END with its error code."""
    expr = ":trainserve:serve_local:version_state{}"
    series = assert_series(prometheus, expr, {"version", "state", "error_code"})
    states = {(s["metric"]["version"], s["metric"]["state"], s["metric"]["error_code"]) for s in series}
    assert states == {("1", "AVAILABLE", "OK"), ("2", "AVAILABLE", "OK"), ("3", "END", "UNKNOWN")}, f"{expr}: {states}"


def every_check(proxy: bool = False) -> list[tuple[str, Callable[[Prometheus], None]]]:
    """(what it checks, the check) for every recording rule, alert, dashboard query, the model variable and the
    versions' states: what the e2e test runs in one go; those that read the proxy's metrics only with
    `proxy` (a Prometheus that scrapes one)."""
    keep = (lambda expr: True) if proxy else (lambda expr: not reads_proxy(expr))
    checks: list[tuple[str, Callable[[Prometheus], None]]] = [
        *((f"record {r}", lambda p, r=r: check_record(p, r)) for r in sorted(RECORDS) if keep(RECORDS[r])),
        *((f"alert {a}", lambda p, a=a: check_alert(p, a)) for a in sorted(ALERTS) if keep(ALERTS[a]["expr"])),
        *(
            (f"dashboard {panel!r}: {expr}", lambda p, e=expr, g=legend: check_dashboard_query(p, e, g))
            for panel, expr, legend in dashboard_targets()
            if keep(expr)
        ),
    ]
    return [*checks, ("dashboard variable model", check_model_variable), ("version_state", check_version_state)]
