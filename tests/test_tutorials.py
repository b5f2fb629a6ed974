"""The tutorial and how-to pages work as a reader follows them: in the order of the site's navigation, in one
scratch checkout (a copy of this one, with `.venv` and `demo/` as the README's `make venv` and `make demo` leave
them), each page in a new shell at the checkout's root whose PATH has no virtual environment on it, as a
newcomer's has. A page's `bash`, `console` and `python` blocks run in order in that shell, with free ports in place
of 8500 and 8501, and what a `console` block shows is what the commands print (decimals aside). A block that is not
run says why in the page's source (tests/tutorial_pages.py reads the markers)."""

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
    nav_pages,
    newcomer_path,
    outputs,
    read_blocks,
    run_script,
    runs_something,
    scratch_checkout,
    script,
)

from conftest import REPO, free_port, require

PAGES = nav_pages(REPO / "mkdocs.yml")
RUNNABLE = [page for page in PAGES if runs_something(page)]


def ids(pages: list[Path]) -> list[str]:
    return [str(page.relative_to(REPO / "docs").with_suffix("")) for page in pages]


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
def test_the_pages_are_found_in_the_order_of_the_sites_navigation():
    assert ids(RUNNABLE)[:4] == ["tutorial/csv", "tutorial/images", "tutorial/rollout", "how-to/tls"]
    assert {page.stem for page in RUNNABLE} >= {"load-testing", "own-model"}


@pytest.mark.unit
def test_a_newcomers_path_holds_no_virtual_environment(tmp_path):
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    (tmp_path / "venv" / "pyvenv.cfg").touch()
    path = os.pathsep.join([str(venv_bin), "/usr/local/bin", str(tmp_path), "/usr/bin"])
    assert newcomer_path(path) == os.pathsep.join(["/usr/local/bin", str(tmp_path), "/usr/bin"])


@pytest.mark.unit
def test_the_site_and_the_readme_list_the_same_how_to_guides():
    readme_row = next(line for line in (REPO / "README.md").read_text().splitlines() if "**How-to guides**" in line)
    index_item = (REPO / "docs" / "index.md").read_text().split("- **How-to guides**:")[1].split("\n- ")[0]
    readme = [link.removeprefix("docs/") for link in re.findall(r"\]\(([^)]+\.md)\)", readme_row)]
    assert re.findall(r"\]\(([^)]+\.md)\)", index_item) == readme


@pytest.mark.unit
@pytest.mark.parametrize("page", PAGES, ids=ids(PAGES))
def test_a_block_not_run_says_why_and_every_make_target_exists(page):
    blocks = read_blocks(page)
    assert blocks or "tutorial" not in page.parts, f"{page.name}: a tutorial with no bash, console or python block"
    fences = re.findall(r"^\s*```(bash|console|python)$", page.read_text(), re.M)
    assert len(fences) == len(blocks), f"{page.name}: a command block the test cannot read (indented?)"
    for block in blocks:
        where = f"{page.name}:{block.line}"
        assert block.mark is None or len(block.why.split()) >= 3, f"{where}: a marker names its reason"
        if block.mark is None and not any(step.command for step in block.steps):
            pytest.fail(f"{where}: output with no command, and no marker saying which test checks it")
    targets = set(re.findall(r"^([a-z][\w-]*):", (REPO / "Makefile").read_text(), re.M))
    assert make_targets(blocks) <= targets, f"{page.name}: make targets not in the Makefile"


class Reader:
    """One reader's checkout and how each page run there ended (None: as written)."""

    def __init__(self, root: Path):
        self.root = root
        self.ended: dict[Path, tuple | None] = {}

    def follow(self, page: Path) -> tuple | None:
        """Runs the pages before `page` that have not run (a selection with -k still reads them first), then
        `page`; (block, message) of its first failure, else None. Skips it when an earlier page failed."""
        for earlier in RUNNABLE[: RUNNABLE.index(page)]:
            if earlier not in self.ended:
                self.ended[earlier] = run_page(earlier, self.root)
            if self.ended[earlier]:
                pytest.skip(f"{earlier.name}, before it in the site's order, failed: this page goes on from it")
        self.ended[page] = run_page(page, self.root)
        return self.ended[page]


@pytest.fixture(scope="module")
def reader(tmp_path_factory, trained_digits) -> Reader:
    """The checkout after the README's `make demo`: `.venv` (the test's own environment) and `demo/` (the
    session's trained digits, in the demo's layout), the pages' work/ still empty."""
    root = scratch_checkout(REPO, tmp_path_factory.mktemp("checkout"), Path(sys.executable).parent.parent)
    for part in ("models", "data", "logs"):
        shutil.copytree(trained_digits / part, root / "demo" / part)
    return Reader(root)


# One worker runs the pages, in the navigation's order (parametrize keeps it; `--dist loadgroup` sends a group
# to one worker in collection order): each page reads on from the ones before it.
@pytest.mark.integration
@pytest.mark.xdist_group("tutorials")
@pytest.mark.parametrize("page", RUNNABLE, ids=ids(RUNNABLE))
def test_the_page_runs_as_written_after_the_pages_before_it(page, reader):
    blocks = read_blocks(page)
    failure = reader.follow(page)
    pending = [block for block in blocks if block.mark == "pending"]
    if failure and pending and failure[0].mark == "pending":
        pytest.xfail(f"{page.name}:{failure[0].line} pending ({failure[0].why}): {failure[1]}")
    if failure:
        pytest.fail(failure[1], pytrace=False)
    assert not pending, f"{page.name}:{pending[0].line} passes now: remove its pending marker"


def run_page(page: Path, root: Path) -> tuple | None:
    """The page's blocks as one script in a new shell at the checkout's root, with a newcomer's PATH; the first
    failure, as first_failure gives it."""
    blocks = read_blocks(page)
    grpc, rest = free_port(), free_port()
    text, steps = script(blocks, {8500: grpc, 8501: rest})
    if re.search(r"\bcurl ", text):
        require("curl", shutil.which("curl") is not None, "the page's commands call it (.ci/run installs it)")
    env = {name: value for name, value in os.environ.items() if name not in ("VIRTUAL_ENV", "TRAINSERVE_BAKE")}
    env |= {
        "PATH": newcomer_path(os.environ["PATH"]),
        "TRAINSERVE_PORT": str(grpc),  # a page's serve-local and clients on their default port
        "TRAINSERVE_SERVER": f"localhost:{grpc}",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    code, printed = run_script(text, root, env, timeout=300)
    return first_failure(page, blocks, steps, code, outputs(printed), printed)


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
