"""The tutorial pages as a reader follows them: their fenced `bash`, `console` and `python` blocks, in order, as
one shell script per page, and the output a `console` block shows compared with what the commands printed.

A block is run unless an HTML comment on the line above it says otherwise, visibly in the page's source:
`<!-- tutorial-test: skip REASON -->` (not run: it needs Docker, or it is a synopsis with placeholders) or
`<!-- tutorial-test: pending REASON -->` (run, and expected to fail until REASON is done: the test says so when it
passes). In a `console` block, `$ ` starts a command (continued while a line ends with `\\` or a quote is open)
and the lines up to the next command are what it prints."""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

MARKER = r"^(?:<!-- tutorial-test: (?P<mark>skip|pending) (?P<why>.+?) -->\n)?"
FENCE = re.compile(MARKER + r"^```(?P<lang>\S*)\n(?P<body>.*?)^```$", re.M | re.S)
STEP_MARK = "@@tutorial-step"
# Stable parts only: a decimal may differ (timings, another machine's float round-off), as may a throughput; the
# words, the integers (counts, versions) and the lines' order may not. `...` in a page elides anything.
DECIMAL = r"[-+]?\d[\d,]*\.\d+(?:e[-+]?\d+)?"
THROUGHPUT = re.compile(r"(?<=examples/s)\s+[\d,]+")
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ |^\d\d:\d\d:\d\d,\d+ ")


@dataclass
class Step:
    """One command (a `console` line and what the page shows it printing) or one whole `bash` block."""

    block: int
    command: str
    shown: list[str] = field(default_factory=list)


@dataclass
class Block:
    index: int
    lang: str
    line: int  # where the fence opens, for messages
    mark: str | None  # None (run), "skip" or "pending"
    why: str
    steps: list[Step]


def read_blocks(page: Path) -> list[Block]:
    """The page's `bash`, `console` and `python` blocks (the others are not commands), with their markers."""
    text = page.read_text()
    blocks = []
    for match in FENCE.finditer(text):
        if match["lang"] not in ("bash", "console", "python"):
            continue
        index, body = len(blocks), match["body"]
        if match["lang"] == "console":
            steps = console_steps(index, body)
        elif match["lang"] == "python":  # a client a reader pastes into python, in the page's directory
            steps = [Step(index, f"python - <<'TUTORIAL_PY'\n{body}TUTORIAL_PY")]
        else:
            steps = [Step(index, body)]
        line = text.count("\n", 0, match.start("lang")) + 1
        blocks.append(Block(index, match["lang"], line, match["mark"], match["why"] or "", steps))
    return blocks


def console_steps(block: int, body: str) -> list[Step]:
    """`$ command` lines (with their continuations) and the output lines that follow each."""
    steps: list[Step] = []
    open_command: list[str] | None = None
    for line in body.splitlines():
        if open_command is not None:
            open_command.append(line)
        elif line.startswith("$ "):
            open_command = [line[2:]]
            steps.append(Step(block, ""))
        elif steps:
            steps[-1].shown.append(line)
        else:
            steps.append(Step(block, "", [line]))  # output with no command on the page (a log shown whole)
        if open_command is not None and complete("\n".join(open_command)):
            steps[-1].command, open_command = "\n".join(open_command), None
    return steps


def complete(command: str) -> bool:
    if command.endswith("\\"):
        return False
    try:
        shlex.split(command)
    except ValueError:  # an open quote: the command goes on on the next line
        return False
    return True


def substitute(command: str, ports: dict[int, int]) -> str:
    """The page's ports (8500, 8501) as free ones: the test shares its machine."""
    for page_port, port in ports.items():
        command = re.sub(rf"\b{page_port}\b", str(port), command)
    return command


def script(blocks: list[Block], ports: dict[int, int]) -> tuple[str, list[Step]]:
    """One bash script for the page: each step announced on stdout by its number, stopping at the first failure,
    and every job the page put in the background (a server) stopped with SIGTERM at the end."""
    stop_jobs = "status=$?; kill -TERM $(jobs -p) 2>/dev/null || true; wait || true; exit $status"
    lines = ["exec 2>&1", "set -eo pipefail", f"trap '{stop_jobs}' EXIT"]
    steps = [
        dataclasses.replace(step, shown=[substitute(line, ports) for line in step.shown])  # it prints them too
        for block in blocks
        if block.mark != "skip"
        for step in block.steps
        if step.command
    ]
    for number, step in enumerate(steps):
        lines += [f"printf '\\n{STEP_MARK} {number}@@\\n'", substitute(step.command, ports)]
    return "\n".join(lines) + "\n", steps


def run_script(text: str, cwd: Path, env: dict[str, str], timeout: float) -> tuple[int, str]:
    """Runs the page's script in its own process group, so that a server it left running cannot outlive it."""
    proc = subprocess.Popen(
        ["bash", "-c", text], cwd=cwd, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return -1, out + f"\n(timed out after {timeout} s)"
    return proc.returncode, out


def outputs(text: str) -> dict[int, str]:
    """What each step printed, by step number."""
    parts = re.split(rf"^{STEP_MARK} (\d+)@@$", text, flags=re.M)
    return {int(number): out for number, out in zip(parts[1::2], parts[2::2])}


def line_pattern(shown: str) -> re.Pattern:
    """A shown line as a pattern over a printed line: decimals as any decimal, `...` as anything, runs of spaces
    (a table's alignment) as any run."""
    pieces = []
    for piece in re.split(rf"(\.\.\.|{DECIMAL}|\s+)", shown):
        if piece == "...":
            pieces.append(".*")
        elif piece and piece.isspace():
            pieces.append(r"\s+")
        elif piece and re.fullmatch(DECIMAL, piece):
            pieces.append(DECIMAL)
        else:
            pieces.append(re.escape(piece))
    return re.compile("".join(pieces))


def stable_part(line: str) -> str:
    """A line without what differs from run to run by nature: its leading timestamp, a throughput."""
    return THROUGHPUT.sub(" N", TIMESTAMP.sub("", line)).strip()


def missing_lines(shown: list[str], printed: str) -> list[str]:
    """The shown lines not found, in order, among the printed ones (a page may leave printed lines out)."""
    lines = [stable_part(line) for line in printed.splitlines()]
    position, missing = 0, []
    for line in filter(str.strip, shown):
        pattern = line_pattern(stable_part(line))
        found = next((i for i in range(position, len(lines)) if pattern.fullmatch(lines[i])), None)
        if found is None:
            missing.append(line)
        else:
            position = found + 1
    return missing


def shown_output(page: Path) -> list[str]:
    """The lines a page shows with no command before them: the output of a command run elsewhere (`make demo`)."""
    return [line for block in read_blocks(page) for step in block.steps if not step.command for line in step.shown]


def runs_something(page: Path) -> bool:
    return any(block.mark != "skip" and any(step.command for step in block.steps) for block in read_blocks(page))


def make_targets(blocks: list[Block]) -> set[str]:
    """Every `make TARGET` a page's commands name."""
    commands = "\n".join(step.command for block in blocks for step in block.steps)
    invocations = re.findall(r"\bmake ((?:[a-z][\w-]*[ \t]?)+)", commands)
    return {target for targets in invocations for target in targets.split()}


def nav_pages(mkdocs: Path, sections: tuple[str, ...] = ("Tutorial", "How-to guides")) -> list[Path]:
    """The pages of the site's navigation sections, in the order a reader meets them."""
    import yaml

    nav = yaml.safe_load(mkdocs.read_text())["nav"]
    entries = [page for entry in nav for name, pages in entry.items() if name in sections for page in pages]
    return [mkdocs.parent / "docs" / path for entry in entries for path in entry.values()]


def newcomer_path(path: str) -> str:
    """PATH without any virtual environment's bin/ (the test's own among them): what a shell has after the
    README's `make` commands, which activate nothing."""
    return os.pathsep.join(
        entry for entry in path.split(os.pathsep) if entry and not (Path(entry).parent / "pyvenv.cfg").is_file()
    )


def scratch_checkout(repo: Path, root: Path, venv: Path) -> Path:
    """A copy of the checkout's files (tracked, and new ones git does not ignore), with `.venv` as `make venv`
    leaves it: the environment's directories linked from `venv`, its marker newer than pyproject.toml, so
    that a page's `make` target finds it up to date and never installs into `venv`."""
    listed = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for name in filter(None, listed.split("\0")):
        source, target = repo / name, root / name
        if source.is_file() or source.is_symlink():  # a deleted file is still listed until committed
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target, follow_symlinks=False)
    (root / ".venv").mkdir()
    for entry in venv.iterdir():
        if entry.name != ".installed":
            (root / ".venv" / entry.name).symlink_to(entry)
    (root / ".venv" / ".installed").touch()
    return root
