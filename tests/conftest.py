"""Shared fixtures: a real tiny SavedModel, and a runner for the real `trainserve` CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = Path(__file__).resolve().parents[1]


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 300):
    """`python -m trainserve ARGS` in a fresh process; returns the CompletedProcess (text)."""
    return subprocess.run(
        [sys.executable, "-m", "trainserve", *map(str, args)],
        cwd=cwd,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_one_line_error(proc, *fragments: str) -> str:
    """Non-zero exit, no traceback, and a last stderr line that names what was expected."""
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert "error:" in line, proc.stderr
    for fragment in fragments:
        assert fragment in line, line
    return line


@pytest.fixture(scope="session")
def tiny_savedmodel(tmp_path_factory) -> Path:
    """A real trainserve-style export of an untrained 8x8x1 CNN, with warmup requests (made in-process)."""
    import keras

    from trainserve.export import export_savedmodel, write_warmup_requests
    from trainserve.model import build_model

    keras.utils.set_random_seed(0)
    path = tmp_path_factory.mktemp("tiny") / "template"
    model = build_model("cnn", (8, 8, 1), 10)
    export_savedmodel(model, path, (8, 8, 1))
    images = np.random.default_rng(0).integers(0, 256, (8, 8, 8, 1), dtype=np.uint8)
    write_warmup_requests(path, "tiny", images)
    return path
