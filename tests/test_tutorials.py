"""The tutorial pages work as written: each page's `bash`, `console` and `python` blocks run in order in one
shell, in an empty directory laid out as the checkout a reader works in (examples/, .venv/), with free ports in
place of 8500 and 8501, and what a `console` block shows is what the commands print (decimals aside). A block
that is not run says why in the page's source (tests/tutorial_pages.py reads the markers)."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest
from tutorial_pages import (
    console_steps,
    make_targets,
    missing_lines,
    outputs,
    read_blocks,
    run_script,
    runs_something,
    script,
)

from conftest import REPO, free_port, require

PAGES = sorted((REPO / "docs" / "tutorial").glob("*.md"))
RUNNABLE = [page for page in PAGES if runs_something(page)]


def ids(pages: list[Path]) -> list[str]:
    return [page.stem for page in pages]


@pytest.mark.unit
def test_a_console_command_goes_on_past_a_backslash_and_an_open_quote():
    body = '$ train --a \\\n    --b\nline 1\n$ curl -d \'{"x": 1,\n  "y": 2}\'\n{}\n$ true\n'
    steps = console_steps(0, body)
    assert [(step.command, step.shown) for step in steps] == [
        ("train --a \\\n    --b", ["line 1"]),
        ('curl -d \'{"x": 1,\n  "y": 2}\'', ["{}"]),
        ("true", []),
    ]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("printed", "missing"),
    [
        ("2026-11-27 12:00:01,5 v1 accuracy 0.9011\nmore\n  examples/s   9,120  p50 3.1\nstable -> 1", []),
        ("v1 accuracy 0.9011\nexamples/s 31 p50 3.1\nstable -> 2", ["stable -> 1"]),  # an integer is exact
        ("examples/s 31 p50 3.1\nv1 accuracy 0.9011\nstable -> 1", ["examples/s 231 p50 12.0"]),  # in order
        ("v2 accuracy 0.9011\nexamples/s 31 p50 3.1\nstable -> 1", ["v1 accuracy 0.95"]),
    ],
    ids=["decimals-timestamps-throughput-vary", "integer-differs", "order-differs", "word-differs"],
)
def test_a_shown_line_is_printed_with_only_its_decimals_free(printed, missing):
    shown = ["v1 accuracy 0.95", "examples/s 231 p50 12.0", "stable -> 1"]
    assert missing_lines(shown, printed) == missing


@pytest.mark.unit
def test_the_pages_are_found():
    assert {page.stem for page in RUNNABLE} >= {"csv", "images", "rollout"}


@pytest.mark.unit
@pytest.mark.parametrize("page", PAGES, ids=ids(PAGES))
def test_a_block_not_run_says_why_and_every_make_target_exists(page):
    blocks = read_blocks(page)
    assert blocks, f"{page.name}: no bash, console or python block"
    fences = re.findall(r"^\s*```(bash|console|python)$", page.read_text(), re.M)
    assert len(fences) == len(blocks), f"{page.name}: a command block the test cannot read (indented?)"
    for block in blocks:
        where = f"{page.name}:{block.line}"
        assert block.mark is None or len(block.why.split()) >= 3, f"{where}: a marker names its reason"
        if block.mark is None and not any(step.command for step in block.steps):
            pytest.fail(f"{where}: output with no command, and no marker saying which test checks it")
    targets = set(re.findall(r"^([a-z][\w-]*):", (REPO / "Makefile").read_text(), re.M))
    assert make_targets(blocks) <= targets, f"{page.name}: make targets not in the Makefile"


@pytest.mark.integration
@pytest.mark.parametrize("page", RUNNABLE, ids=ids(RUNNABLE))
def test_the_page_runs_as_written(page, tmp_path):
    blocks = read_blocks(page)
    grpc, rest = free_port(), free_port()
    text, steps = script(blocks, {8500: grpc, 8501: rest})
    if re.search(r"\bcurl ", text):
        require("curl", shutil.which("curl") is not None, "the page's commands call it (.ci/run installs it)")
    (tmp_path / "examples").symlink_to(REPO / "examples")  # the reader works in the checkout
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parent.parent)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "TRAINSERVE_PORT": str(grpc),  # a page's serve-local and clients on their default port
        "TRAINSERVE_SERVER": f"localhost:{grpc}",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    code, printed = run_script(text, tmp_path, env, timeout=400)
    by_step = outputs(printed)
    pending = [block for block in blocks if block.mark == "pending"]
    failure = first_failure(page, blocks, steps, code, by_step, printed)
    if failure and pending and failure[0].mark == "pending":
        pytest.xfail(f"{page.name}:{failure[0].line} pending ({failure[0].why}): {failure[1]}")
    if failure:
        pytest.fail(failure[1], pytrace=False)
    assert not pending, f"{page.name}:{pending[0].line} passes now: remove its pending marker"


def first_failure(page, blocks, steps, code, by_step, printed):
    """(block, message) of the first step whose output differs from the page's, or that failed; else None."""
    for number, step in enumerate(steps):
        block = blocks[step.block]
        where = f"{page.name}:{block.line} `{step.command.splitlines()[0]}`"
        if number not in by_step:
            return block, f"{where} never ran; the page's shell printed:\n{printed[-4000:]}"
        if missing := missing_lines(step.shown, by_step[number]):
            return block, f"{where}: shown, not printed: {missing}\nprinted:\n{by_step[number][-4000:]}"
        if number == len(by_step) - 1 and code != 0:
            return block, f"{where} failed (exit {code}):\n{by_step[number][-4000:]}"
    return None
