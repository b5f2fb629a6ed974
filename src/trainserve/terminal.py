"""What a command shows a person at a terminal besides its log lines: a tqdm progress bar where stderr is a
terminal (nothing where it is a pipe or a file, a CI log, whose lines say the same), and how to open a page it
wrote."""

from __future__ import annotations

import sys
from pathlib import Path


def on_terminal() -> bool:
    """Whether a person is watching stderr (a progress bar is drawn there)."""
    return sys.stderr.isatty()


def progress_bar(total: float | None, unit: str, desc: str, show: bool | None = None):
    """A tqdm bar on stderr; a no-op one off a terminal (`show` None: on_terminal())."""
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, desc=desc, disable=not (on_terminal() if show is None else show))


def browser_line(page: Path) -> str:
    """The line that ends a command which wrote an HTML page: how to open it, as a URL a terminal can follow."""
    return f"open it in a browser: {Path(page).resolve().as_uri()}"


def say_page(page: Path) -> None:
    """The page a command wrote, on stdout: its path, then how to open it."""
    print(f"report: {page}")
    print(browser_line(page))
