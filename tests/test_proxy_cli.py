"""`trainserve proxy` as users start it: a fresh process that imports no TensorFlow (it runs in the light
image), one-line errors for bad flags before any port opens, and SIGTERM ending it with its records written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import grpc
import pytest

from conftest import assert_one_line_error, free_port, install_version, run_cli
from serving_fixtures import InProcessServer, predict_request
from trainserve.tfrecord import iter_records

# The unit tests here: subprocesses that import no TensorFlow; the server runs in this process.
HEAVY = ("tensorflow", "tensorflow_serving", "keras")
IMPORTS = f"""
import json, sys
import trainserve.cli, trainserve.proxy.server, trainserve.proxy.commands
print(json.dumps(sorted({{m.split(".")[0] for m in sys.modules}} & set({HEAVY!r}))))
"""


@pytest.mark.unit
def test_the_proxy_imports_no_tensorflow():
    proc = subprocess.run([sys.executable, "-c", IMPORTS], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []


@pytest.mark.unit
@pytest.mark.parametrize(
    "flags, fragment",
    [
        ([], "--filename-prefix ''"),
        (["--filename-prefix", "caps/"], "--filename-prefix 'caps/'"),
        (["--filename-prefix", "caps/p", "--sampling-rate", "2"], "--sampling-rate 2.0"),
        (["--filename-prefix", "caps/p", "--upstream", "nohost"], "expected HOST:PORT"),
        (["--filename-prefix", "caps/p", "--listen-tls-cert", "x.crt"], "--listen-tls-key"),
        (["--filename-prefix", "caps/p", "--capture-max-file-mb", "0"], "above 0"),
        (["--filename-prefix", "caps/p", "--upstream-wait", "0"], "--upstream-wait 0.0"),
        (["--filename-prefix", "caps/p", "--tls-cert", "x.crt"], "--tls-key"),
        (["--filename-prefix", "caps/p", "--listen-tls-cert", "no.crt", "--listen-tls-key", "no.key"], "no.crt"),
    ],
    ids=[
        "no-prefix",
        "prefix-is-a-directory",
        "rate",
        "upstream",
        "listen-half",
        "file-size",
        "upstream-wait",
        "tls-half",
        "no-files",
    ],
)
def test_bad_flags_are_one_line_before_any_port_opens(tmp_path, flags, fragment):
    port = free_port()
    proc = run_cli("proxy", "--port", str(port), "--rest-port", str(free_port()), *flags, cwd=tmp_path, timeout=60)
    assert_one_line_error(proc, fragment)
    assert not (tmp_path / "caps").exists(), "nothing written"


@pytest.mark.integration
@pytest.mark.parametrize("name", ["proxy", "capture"], ids=["proxy", "former-name"])
def test_sigterm_ends_the_proxy_with_its_records_written(tmp_path, model_versions, name):
    install_version(model_versions[0], tmp_path / "m", 1)
    upstream = InProcessServer("--model_name=m", f"--model_base_path={tmp_path / 'm'}")
    upstream.wait_available("m", 1)
    port = free_port()
    command = [sys.executable, "-m", "trainserve", name, "--upstream", upstream.target, "--port", str(port)]
    command += ["--filename-prefix", str(tmp_path / "caps" / "p")]
    proxy = subprocess.Popen(
        command, stderr=subprocess.PIPE, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=60)
            call = channel.unary_unary("/tensorflow.serving.PredictionService/Predict")
            for _ in range(5):
                call(predict_request().SerializeToString(), timeout=30)
        proxy.send_signal(signal.SIGTERM)
        assert proxy.wait(timeout=60) == 0, proxy.stderr.read()
    finally:
        if proxy.poll() is None:
            proxy.kill()
        proxy.wait()
        assert upstream.stop() == 0
    (path,) = (tmp_path / "caps").glob("p-*.tfrecord")
    with open(path, "rb") as stream:
        assert len(list(iter_records(stream))) == 5
    log = proxy.stderr.read()
    assert "records offered 5, written 5, dropped none, lost none, pending 0" in log
    assert ("`trainserve capture` is now `trainserve proxy`" in log) == (name == "capture")


@pytest.mark.unit
def test_the_sidecar_probes_the_proxys_own_pages_and_its_stop_fits_the_pods_grace():
    from test_k8s import render

    from trainserve.proxy.config import LIVE_PATH, READY_PATH
    from trainserve.proxy.upstream import PROBE_SECONDS

    (deployment,) = [
        d for d in render("k8s/overlays/proxy") if d["kind"] == "Deployment" and "serve" in d["metadata"]["name"]
    ]
    spec = deployment["spec"]["template"]["spec"]
    (sidecar,) = [c for c in spec["containers"] if c["name"] == "proxy"]
    assert sidecar["readinessProbe"]["httpGet"]["path"] == READY_PATH
    assert sidecar["livenessProbe"]["httpGet"]["path"] == LIVE_PATH
    assert sidecar["readinessProbe"]["timeoutSeconds"] > 1.0 + 2 * PROBE_SECONDS  # a check's longest wait
    env = {e["name"]: e["value"] for e in sidecar["env"]}
    pre_stop = int(sidecar["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pre_stop + float(env["TRAINSERVE_STOP_GRACE"]) < spec["terminationGracePeriodSeconds"]
