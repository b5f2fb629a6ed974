"""`make demo`'s script, as a user runs it: server first, training meanwhile, eval of the version it published."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tutorial_pages import missing_lines, shown_output

from conftest import REPO, free_port

pytestmark = pytest.mark.integration


def test_demo_trains_serves_and_evaluates_the_version_it_published(tmp_path):
    demo, log = tmp_path / "demo", tmp_path / "demo.log"
    env = {
        **os.environ,
        "BIN": str(Path(sys.executable).parent),
        "DEMO_DIR": str(demo),
        "DEMO_EPOCHS": "5",
        "GRPC_PORT": str(free_port()),
        "REST_PORT": str(free_port()),
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    with open(log, "w") as out:  # a file, as in a CI log: nothing the script writes may truncate it
        out.write("written before the demo\n")
        out.flush()
        proc = subprocess.run([REPO / "scripts" / "demo.sh"], env=env, stdout=out, stderr=out, timeout=600)
    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    assert text.startswith("written before the demo\n"), "the log was truncated"
    assert "no GPU visible: training on the CPU" in text and "published digits version 1 at" in text
    report = json.loads((demo / "reports" / "eval.json").read_text())
    assert report["version"] == 1 and report["passed"] and report["metrics"]["accuracy"] >= 0.9
    evidence = report["evidence"]  # the version on its own held-out split, verified against its record, whole
    assert (evidence["kind"], evidence["partial"], report["data_check"]["matches"]) == ("own-split", False, True)
    assert {p.name for p in (demo / "reports").glob("*.png")} == {"confusion_matrix.png", "latency_histogram.png"}
    assert "waiting for digits to become AVAILABLE" in (demo / "serve-local.log").read_text(), "the server came first"
    # What the tutorial page shows `make demo` printing, at the page's paths and ports.
    printed = text.replace(f"{tmp_path}/", "").replace(f"{env['BIN']}/", ".venv/bin/")
    for port, shown in ((env["GRPC_PORT"], "8500"), (env["REST_PORT"], "8501")):
        printed = printed.replace(f":{port}", f":{shown}").replace(f"={port}", f"={shown}")
    missing = missing_lines(shown_output(REPO / "docs" / "tutorial" / "demo.md"), printed)
    assert not missing, f"docs/tutorial/demo.md shows lines the demo did not print: {missing}\n{printed[-3000:]}"
