"""What commands say to a newcomer, in their own words: the page a command wrote and how to open it, the serving
config's note on capturing traffic (true of serve-local and of tensorflow_model_server), and the old name's
leftovers gone from the words about the proxy (issue 57)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainserve.cli import build_parser
from trainserve.model_server_config import parse_model_config
from trainserve.rollout.config_file import new_config, write_config
from trainserve.terminal import browser_line

pytestmark = pytest.mark.unit


def test_browser_line_is_a_url_to_the_page_from_anywhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert (
        browser_line(Path("reports/eval.html")) == f"open it in a browser: {(tmp_path / 'reports/eval.html').as_uri()}"
    )


def fake_reports(monkeypatch, package: str, table: str) -> None:
    """The publishing of `package` (drift, replay, live) with its page and JSON written nowhere."""
    monkeypatch.setattr(f"trainserve.{package}.html.write_html", lambda report, path: path)
    monkeypatch.setattr(f"trainserve.{package}.report.write_report", lambda report, path: path)
    monkeypatch.setattr(f"trainserve.{package}.report.{table}", lambda report: "TABLE")


@pytest.mark.parametrize(
    ("package", "table", "publish"),
    [
        ("drift", "drift_table", lambda p: sys.modules["trainserve.drift.commands"]._publish({"drifted": []}, p)),
        (
            "replay",
            "summary_table",
            lambda p: sys.modules["trainserve.replay.commands"]._publish({"gates": []}, p, "x"),
        ),
        ("live", "live_table", lambda p: sys.modules["trainserve.live.commands"]._publish_live({"gates": []}, p)),
    ],
)
def test_a_command_that_writes_a_page_ends_saying_how_to_open_it(
    package, table, publish, tmp_path, capsys, monkeypatch
):
    __import__(f"trainserve.{package}.commands")
    fake_reports(monkeypatch, package, table)
    if package == "drift":
        monkeypatch.setattr("trainserve.drift.report.unprofiled_lines", lambda report: [])
    if package == "live":
        monkeypatch.setattr("trainserve.live.report.report_warnings", lambda report: [])
    assert publish(tmp_path / "r.json") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2:] == [f"report: {tmp_path / 'r.html'}", f"open it in a browser: {(tmp_path / 'r.html').as_uri()}"]


def test_eval_ends_saying_how_to_open_its_page(tmp_path, capsys, monkeypatch):
    result = SimpleNamespace(report={"data_check": None, "gates": []})
    monkeypatch.setattr("trainserve.evaluation.run.evaluate", lambda config: result)
    monkeypatch.setattr("trainserve.evaluation.report.summary_table", lambda report: "TABLE")
    monkeypatch.setattr("trainserve.evaluation.report.write_report", lambda report, path: path)
    monkeypatch.setattr("trainserve.evaluation.report.write_plots", lambda result, where: [where / "latency.png"])
    monkeypatch.setattr("trainserve.evaluation.html_report.write_html", lambda result, path: path)
    args = build_parser().parse_args(
        ["eval", "--model", "m", "--data", "x.npz", "--report", str(tmp_path / "e.json"), "--plots", str(tmp_path)]
    )
    args.func(args)
    lines = capsys.readouterr().out.splitlines()
    assert lines[-3:] == [
        f"report: {tmp_path / 'e.html'}",
        f"plot: {tmp_path / 'latency.png'}",
        f"open it in a browser: {(tmp_path / 'e.html').as_uri()}",
    ]


def test_the_config_note_on_capture_names_what_each_server_accepts(tmp_path):
    path = tmp_path / "models.config"
    write_config(path, new_config("m", "/models/m"))
    note = path.read_text().split("model_config_list")[0]
    assert "serve-local" in note and "tensorflow_model_server rejects it" in note and "trainserve proxy" in note
    assert parse_model_config(path).model_config_list.config[0].name == "m", "the note is comments only"


def test_no_word_of_the_old_name_is_left_where_issue_57_found_it():
    import trainserve.proxy
    import trainserve.traffic.reader

    assert (
        "capture export" not in trainserve.traffic.reader.__doc__
        and "proxy export" in trainserve.traffic.reader.__doc__
    )
    assert "routes" in trainserve.proxy.__doc__ and "counts" in trainserve.proxy.__doc__
