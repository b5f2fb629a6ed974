"""The rollout history: one JSON line per change (who, what, when, on which report), appended next to
the config and never rewritten, so that "why is version 7 stable?" has an answer after the fact.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import time
from pathlib import Path

from trainserve import __version__


def who() -> str:
    """user@host of the change (in a container: the uid and the pod or container name)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # a uid with no passwd entry, as in the images
        user = f"uid{os.getuid()}"
    return f"{user}@{socket.gethostname()}"


def append_history(path: Path, record: dict) -> dict:
    """Append `record` (plus time, who, trainserve version) as one line; fsync'd before returning."""
    entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "by": who(), "trainserve": __version__}
    entry.update(record)
    line = json.dumps(entry, sort_keys=True) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return entry


def read_history(path: Path) -> list[dict]:
    """Every record, oldest first ([] before the first change)."""
    if not Path(path).is_file():
        return []
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
