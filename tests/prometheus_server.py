"""A real Prometheus (Debian's `prometheus`) for the tests: its own data directory and free port, the repository's
scrape config pointed at a test's server, started and stopped by pid; and the checks that an expression reads
metrics that exist and returns series with the labels a reader expects."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
from pathlib import Path

import yaml

from conftest import DIRECT, REPO, free_port, require

MONITORING = REPO / "monitoring"
# A metric selector: a name followed by its braces (monitoring/rules.yml writes every selector so).
SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{")
COMPARISON = re.compile(r"(==|!=|>=|<=|>|<)(?!\s*bool\b)")


class Prometheus:
    """`prometheus` scraping `target` every second with monitoring/prometheus.yml's job and rules."""

    def __init__(self, directory: Path, target: str, job: str = "serve-local"):
        require("prometheus", shutil.which("prometheus") is not None, "Debian's prometheus package")
        config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
        config["global"].update(scrape_interval="1s", evaluation_interval="1s")
        config["rule_files"] = [str(MONITORING / name) for name in config["rule_files"]]
        (scrape,) = [c for c in config["scrape_configs"] if c["job_name"] == job]
        scrape["static_configs"] = [{"targets": [target]}]
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
