"""The eval client without TensorFlow: a whole `trainserve eval` against a real serve-local, in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import assert_one_line_error, install_version

pytestmark = pytest.mark.slow
HEAVY = ("tensorflow", "tensorflow_serving", "keras", "sklearn", "tensorboard")
# Runs `trainserve eval ARGS` in this interpreter, then prints the heavy packages it imported. With
# CORE_INSTALL set, those packages cannot be imported at all, as in `pip install trainserve`.
EVAL = f"""
import json, os, sys
if os.environ.get("CORE_INSTALL"):
    sys.modules.update(dict.fromkeys({HEAVY!r}))  # None: `import` raises ModuleNotFoundError
from trainserve.cli import main
code = main(sys.argv[1:])
print(json.dumps(sorted({{m.split(".")[0] for m, v in sys.modules.items() if v is not None}} & set({HEAVY!r}))))
sys.exit(code)
"""


def run_eval(*args: str, core_install: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CORE_INSTALL": "1" if core_install else ""}
    return subprocess.run(
        [sys.executable, "-c", EVAL, "eval", *map(str, args)], env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def served(model_versions, tmp_path_factory):
    from conftest import ServeLocal

    root = tmp_path_factory.mktemp("light")
    install_version(model_versions[0], root / "m", 1)
    server = ServeLocal("--model_name=m", f"--model_base_path={root / 'm'}", log_path=root / "server.log")
    server.wait_available("m", 1)
    rng = np.random.default_rng(0)
    data = root / "test.npz"
    np.savez(data, x_test=rng.integers(0, 256, (300, 8, 8, 1), dtype=np.uint8), y_test=rng.integers(0, 10, 300))
    yield server, data
    assert server.stop() == 0


@pytest.mark.parametrize("core_install", [False, True], ids=["dev-install", "core-install"])
def test_eval_imports_no_tensorflow(served, tmp_path, core_install):
    server, data = served
    proc = run_eval(
        "--server", server.target, "--model", "m", "--data", data, "--batch-size", "64",
        "--report", tmp_path / "eval.json", "--plots", tmp_path / "plots", core_install=core_install,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [], "eval imported a TensorFlow-side package"
    assert json.loads((tmp_path / "eval.json").read_text())["data"]["examples"] == 300
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()), "plots drawn without TensorFlow"


def test_compare_local_without_tensorflow_says_what_to_install(served, tiny_savedmodel):
    server, data = served
    proc = run_eval(
        "--server", server.target, "--model", "m", "--data", data, "--compare-local", tiny_savedmodel,
        core_install=True,
    )  # fmt: skip
    assert_one_line_error(proc, "needs TensorFlow", "pip install 'trainserve[serve]'")


def test_bundled_digits_without_scikit_learn_says_what_to_install(served):
    server, _ = served
    proc = run_eval("--server", server.target, "--model", "m", "--data", "digits", core_install=True)
    assert_one_line_error(proc, "'sklearn'", "pip install 'trainserve[train]'")
