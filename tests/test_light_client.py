"""The clients of a served model without TensorFlow: a whole `trainserve eval`, and a whole gated rollout
(`candidate`, `promote`, `rollback`), against a real serve-local, each client in a fresh process, with and without
TensorFlow, Keras and the serving wheel importable."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import assert_one_line_error, install_version, record_version, target_flags
from serving_fixtures import InProcessServer

# The server runs on a thread of this process; the clients are fresh processes that import no TensorFlow.
HEAVY = ("tensorflow", "tensorflow_serving", "keras", "sklearn", "tensorboard")
# Runs `trainserve ARGS` in this interpreter, then prints the heavy packages it imported. With
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


def run_light(*args: str, core_install: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CORE_INSTALL": "1" if core_install else ""}
    return subprocess.run(
        [sys.executable, "-c", EVAL, *map(str, args)], env=env, capture_output=True, text=True, timeout=300
    )


def run_eval(*args: str, core_install: bool = False) -> subprocess.CompletedProcess:
    return run_light("eval", *args, core_install=core_install)


def heavy_imports(proc: subprocess.CompletedProcess) -> list[str]:
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def served(model_versions, tmp_path_factory):
    root = tmp_path_factory.mktemp("light")
    install_version(model_versions[0], root / "m", 1)
    server = InProcessServer("--model_name=m", f"--model_base_path={root / 'm'}")
    server.wait_available("m", 1)
    rng = np.random.default_rng(0)
    data = root / "test.npz"
    np.savez(data, x_test=rng.integers(0, 256, (300, 8, 8, 1), dtype=np.uint8), y_test=rng.integers(0, 10, 300))
    yield server, data
    assert server.stop() == 0


@pytest.mark.integration
@pytest.mark.parametrize("core_install", [False, True], ids=["dev-install", "core-install"])
def test_eval_imports_no_tensorflow(served, tmp_path, core_install):
    server, data = served
    written = ("--report", tmp_path / "eval.json", "--plots", tmp_path / "plots")
    proc = run_eval(*target_flags(server), "--data", data, "--batch-size", "64", *written, core_install=core_install)
    assert proc.returncode == 0, proc.stderr
    assert heavy_imports(proc) == [], "eval imported a TensorFlow-side package"
    assert json.loads((tmp_path / "eval.json").read_text())["data"]["examples"] == 300
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()), "plots drawn without TensorFlow"


@pytest.mark.unit
def test_compare_local_without_tensorflow_says_what_to_install(served, tiny_savedmodel):
    server, data = served
    proc = run_eval(*target_flags(server), "--data", data, "--compare-local", tiny_savedmodel, core_install=True)
    assert_one_line_error(proc, "needs TensorFlow", "pip install 'trainserve[serve]'")


@pytest.mark.unit
def test_bundled_digits_without_scikit_learn_says_what_to_install(served):
    server, _ = served
    proc = run_eval(*target_flags(server), "--data", "digits", core_install=True)
    assert_one_line_error(proc, "'sklearn'", "pip install 'trainserve[train]'")


# The shared client on its own, as a third party's script would use it: wait, resolve a label, Predict pinned.
CLIENT = f"""
import json, sys
sys.modules.update(dict.fromkeys({HEAVY!r}))
import numpy as np
from trainserve.client import ServingClient, Target
with ServingClient(sys.argv[1]) as client:
    target = Target("m", label="stable")
    version = client.wait_until_available(target, 60)
    images = np.zeros((2, 8, 8, 1), np.uint8)
    answer = client.predict(target, {{"images": images}}, ["classes"], version, retries=0)
heavy = {{m.split(".")[0] for m, v in sys.modules.items() if v is not None}} & set({HEAVY!r})
print(json.dumps([version, answer.version, sorted(heavy)]))
"""


@pytest.mark.unit
def test_the_shared_client_imports_no_tensorflow(model_versions, tmp_path):
    base, config = tmp_path / "m", tmp_path / "models.config"
    install_version(model_versions[0], base, 1)
    config.write_text(
        f'model_config_list {{ config {{ name: "m" base_path: "{base}" model_platform: "tensorflow" '
        'version_labels { key: "stable" value: 1 } } }\n'
    )
    server = InProcessServer(f"--model_config_file={config}", "--allow_version_labels_for_unavailable_models")
    try:
        proc = subprocess.run(
            [sys.executable, "-c", CLIENT, server.target], capture_output=True, text=True, timeout=300
        )
    finally:
        assert server.stop() == 0
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [1, 1, []], "resolved, pinned, and no TensorFlow"


def light_ok(*args) -> str:
    """Run a command with TensorFlow, Keras and tensorflow_serving unimportable; it must succeed importing none."""
    proc = run_light(*args, core_install=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert heavy_imports(proc) == [], f"{args[0]} imported a TensorFlow-side package"
    return proc.stdout


@pytest.mark.integration
def test_a_whole_rollout_runs_on_the_core_install(model_versions, tmp_path):
    """candidate -> eval of the candidate -> promote, twice, then rollback: what the eval image runs."""
    base, config = tmp_path / "models" / "m", tmp_path / "rollout" / "models.config"
    data_dir = tmp_path / "data"
    rng = np.random.default_rng(1)
    split = {"images": rng.integers(0, 256, (64, 8, 8, 1), dtype=np.uint8)}, rng.integers(0, 10, 64)
    record_version(install_version(model_versions[0], base, 1), data_dir, "m", *split, {"source": "x.npz", "seed": 0})
    config.parent.mkdir()
    config.write_text(
        f'model_config_list {{ config {{ name: "m" base_path: "{base}" model_platform: "tensorflow" }} }}\n'
    )
    server = InProcessServer(
        f"--model_config_file={config}",
        "--model_config_file_poll_wait_seconds=1",
        "--allow_version_labels_for_unavailable_models",
    )
    try:
        server.wait_available("m", 1)
        rollout = ("--config", config, "--server", server.target)
        for version in (1, 2):
            if version == 2:
                record_version(install_version(model_versions[1], base, 2), data_dir, "m", *split, {"source": "x.npz"})
            assert f"candidate -> {version}" in light_ok("candidate", *rollout, "--wait", "120")
            report = tmp_path / f"r{version}.json"  # its own split, against stable (none yet: the config says so)
            compared = ("--compare-with", "stable", "--allow-no-baseline", "--rollout-config", config)
            compared += ("--max-drop", "accuracy=1")  # untrained versions: the imports are on trial, not the gate
            gated = ("--data-dir", data_dir, *compared, "--min-accuracy", "0", "--report", report)
            light_ok("eval", *target_flags(server, label="candidate"), *gated)
            assert f"stable -> {version}" in light_ok("promote", *rollout, "--report", report)
        assert "stable -> 1" in light_ok("rollback", *rollout, "--reason", "light-client test")
        # The metadata route resolves a label (the status route lists every version, as in TF Serving).
        stable = "/v1/models/m/labels/stable/metadata"
        server.wait_for(lambda: server.get(stable)[1]["model_spec"]["version"] == "1", "stable back on version 1")
    finally:
        assert server.stop() == 0
