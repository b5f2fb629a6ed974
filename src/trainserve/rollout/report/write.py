"""Where the decision report is written, and writing it: for `trainserve rollout report`, and for a rollout that
has just ended, where a page that cannot be written is logged and the decision stands."""

from __future__ import annotations

import logging
from pathlib import Path

from trainserve.files import write_file_atomic
from trainserve.rollout.report.page import render_page
from trainserve.rollout.report.read import read_account

log = logging.getLogger(__name__)


def page_path(history: Path, model: str, candidate: int) -> Path:
    """Where the page of `model`'s rollout of `candidate` is written: beside the history."""
    stem = Path(history).name.removesuffix(".jsonl")
    return Path(history).with_name(f"{stem}-{model.replace('/', '_')}-v{candidate}.html")


def write_page(history: Path, model: str | None = None, out: Path | None = None) -> Path:
    """The page of the last rollout of `model` (None: the history's only model) in `history`, written atomically
    to `out` (default: page_path)."""
    account = read_account(history, model)
    path = out if out is not None else page_path(history, account.model, account.candidate)
    return write_file_atomic(path, render_page(account, Path(history)).encode())


def written(history: Path, model: str) -> Path | None:
    """write_page, for a rollout that has just ended: a page that cannot be written is logged, never raised, so
    that a report never changes or delays a decision (None then)."""
    try:
        path = write_page(history, model)
    except Exception:  # whatever broke the page, the decision stands
        log.warning("model %s: the decision report could not be written beside %s", model, history, exc_info=True)
        return None
    log.info("model %s: decision report %s (open it in a browser: %s)", model, path, path.resolve().as_uri())
    return path
