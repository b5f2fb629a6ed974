"""report.html, opened as a person would: from a file:// URL in a real headless browser (Debian's chromium),
checked for what one would see there: the verdict, the tables, images that decode, no console errors, and
nothing fetched from elsewhere."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conftest import install_version, require
from trainserve.cli import main

pytestmark = pytest.mark.integration  # a browser in a subprocess
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def render(page, tmp_path) -> tuple[str, list[str]]:
    """The DOM after the page's load event, and the browser's console lines."""
    require("chromium", CHROMIUM is not None, "renders report.html in a real browser (.ci/run installs it)")
    proc = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--enable-logging=stderr",
            "--v=0",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]


class Seen(HTMLParser):
    """What the rendered DOM shows: element texts by id, table cells, and every image's attributes."""

    def __init__(self):
        super().__init__()
        self.images, self.cells, self.texts, self._open = [], [], {}, []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs)
        self._open.append((tag, attrs.get("id")))

    def handle_endtag(self, tag):
        while self._open and self._open.pop()[0] != tag:
            pass

    def handle_data(self, data):
        for _, ident in self._open:
            if ident:
                self.texts[ident] = self.texts.get(ident, "") + data
        if self._open and self._open[-1][0] in ("td", "th"):
            self.cells.append(data.strip())


@pytest.fixture(scope="module")
def compared(model_versions, tmp_path_factory):
    """An eval of version 2 against version 1 (two untrained digits CNNs) with --report: eval.json + eval.html."""
    from serving_fixtures import serve_every_version

    root = tmp_path_factory.mktemp("html")
    for version in (1, 2):
        install_version(model_versions[version - 1], root / "m", version)
    server = serve_every_version(root / "models.config", "m", root / "m", (1, 2))
    try:
        main(
            [
                "eval",
                "--server",
                server.target,
                "--model",
                "m",
                "--version",
                "2",
                "--compare-with",
                "1",
                "--data",
                "digits",
                "--report",
                str(root / "eval.json"),
                "--min-accuracy",
                "0.5",
                "--max-drop",
                "accuracy=0.01",
            ]
        )
    finally:
        assert server.stop() == 0
    return root


def opened(page: Path, tmp_path: Path) -> tuple[str, Seen]:
    """`page` as a browser shows it (its DOM, and what a person reads), once it is known to be self-contained,
    under 2 MB, and without a console error."""
    html = page.read_text()
    assert page.stat().st_size < 2 * 2**20, "under 2 MB"
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:|//)", html) and "@import" not in html, "self-contained"
    dom, console = render(page, tmp_path)
    assert console == [], console
    seen = Seen()
    seen.feed(dom)
    return dom, seen


def test_the_report_reads_in_a_browser(compared, tmp_path):
    page = compared / "eval.html"
    report = json.loads((compared / "eval.json").read_text())
    dom, seen = opened(page, tmp_path)
    # What was judged first: model, version, server, data, evidence (digits without a record: unverified).
    header = " ".join(seen.texts["header"].split())
    assert dom.index('id="header"') < dom.index('id="verdict"') < dom.index("<table")
    assert header.startswith(f"model m version 2 on {report['server']}, data ") and "evidence unverified" in header
    # Then the verdict: the gate's outcome, then the comparison's line.
    assert seen.texts["verdict"].startswith("FAILED: accuracy")  # untrained models miss 0.5
    assert seen.texts["comparison-verdict"] == report["comparison"]["verdict_line"]
    assert seen.texts["comparison-verdict"].startswith("v2 vs v1: ")
    # The tables: both versions' metrics with the interval, the discordant pairs, per class, latency.
    for header in (
        "v2",
        "v1",
        "difference",
        "95% CI",
        "detectable with 80% power",
        "adjusted p",
        "v2 right",
        "v1 wrong",
        "precision",
        "p99 ms",
        "right only in v2",
    ):
        assert header in seen.cells, header
    accuracy = report["comparison"]["metrics"]["accuracy"]
    row = seen.cells[seen.cells.index("accuracy") : seen.cells.index("accuracy") + 3]
    assert row == ["accuracy", f"{accuracy['candidate']:.4f}", f"{accuracy['baseline']:.4f}"]
    # What the eval could see: each metric's interval and detectable difference; the slices by evidence.
    assert _number_or_none(accuracy["mdd"]) in seen.texts["evidence"]
    assert accuracy["interval_method"] in seen.texts["evidence"]
    slices = report["comparison"]["slices"]
    assert [r["name"] for r in slices["rows"]] == [c for c in seen.cells if c.startswith("class=")]
    assert [r["p_adjusted"] for r in slices["rows"]] == sorted(r["p_adjusted"] for r in slices["rows"])
    (margin,) = [g for g in report["gates"] if g.get("kind") == "non-inferiority"]
    assert any(c.startswith(f"accuracy {margin['verdict']} to v1") for c in seen.cells), seen.cells
    # Every image decoded: both confusion matrices and both latency histograms, each with a real size.
    ids = {image["id"]: image for image in seen.images}
    assert set(ids) == {"confusion-v2", "confusion-v1", "latency-v2", "latency-v1"}
    assert all(image["src"].startswith("data:image/png;base64,") for image in ids.values())
    assert all(
        int(image["data-natural-width"]) > 100 and int(image["data-natural-height"]) > 100 for image in ids.values()
    ), ids


def _number_or_none(value) -> str:
    return "none: too few examples" if value is None else f"{value:.4f}"


def test_the_browser_check_sees_a_broken_page(tmp_path):
    """The checks above can fail: a script error reaches the console log, a broken image decodes to nothing."""
    page = tmp_path / "broken.html"
    page.write_text(
        '<!DOCTYPE html><html><head><script>window.addEventListener("load", function () {'
        'document.querySelectorAll("img").forEach(function (i) { i.setAttribute("data-natural-width", '
        'i.naturalWidth); }); });</script></head><body><img id="x" src="data:image/png;base64,AAAA">'
        "<script>notDefined();</script></body></html>"
    )
    dom, console = render(page, tmp_path)
    assert any("notDefined" in line for line in console), console
    assert 'data-natural-width="0"' in dom


@pytest.mark.parametrize(
    ("evidence", "headline"),
    [
        pytest.param({}, "PASSED: all 1 gate(s) hold", id="own-split"),
        pytest.param({"kind": "unverified", "said": "no record"}, "UNVERIFIED: all 1 gate(s) hold, on data", id="unv"),
        pytest.param({"partial": True, "examples": 5}, "UNVERIFIED: all 1 gate(s) hold, on 5 of", id="partial"),
    ],
)
def test_the_headline_says_passed_only_on_verified_whole_evidence(tmp_path, evidence, headline):
    from reports import eval_report

    from trainserve.evaluation.html_report import _verdict

    (tmp_path / "1").mkdir()
    report = eval_report(tmp_path / "1")
    report["evidence"].update(evidence)
    assert f'id="verdict">{headline}' in _verdict(report)
