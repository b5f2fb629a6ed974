"""serve-local as a process: what only a process shows (SIGTERM finishing a request and the exit code, one-line
errors for bad flags). Request and response behaviour is tested in process (test_serving_inprocess.py)."""

from __future__ import annotations

import signal

import pytest

from conftest import Gate, run_cli, save_gated_model
from serving_fixtures import predict_request, stubs
from trainserve.tensors import from_tensor_proto

pytestmark = pytest.mark.integration


def test_sigterm_during_a_long_request_finishes_it_and_exits_zero(serve_local, tmp_path):
    save_gated_model(tmp_path / "g" / "1")
    server = serve_local("--model_name=g", f"--model_base_path={tmp_path / 'g'}")
    server.wait_available("g", 1)
    predict, _ = stubs(server)
    gate = Gate(tmp_path)
    future = predict.Predict.future(predict_request("g", **gate.inputs), timeout=120)
    gate.wait_arrived()
    server.proc.send_signal(signal.SIGTERM)
    server.wait_for(lambda: "finishing 1 in-flight request(s)" in server.log(), "the drain to begin")
    assert not future.done(), "the request waits for the test, SIGTERM or not"
    gate.open()
    response = future.result()
    assert from_tensor_proto(response.outputs["arrived"]) == str(gate.arrived).encode()
    assert server.proc.wait(timeout=60) == 0
    assert "stopped cleanly" in server.log()


@pytest.mark.parametrize(
    "flags, fragment",
    [
        pytest.param(
            ["--model_name=m", "--model_base_path=/x", "--rest_api_prot=1"], "--rest_api_prot", id="unknown-flag"
        ),
        pytest.param(["--model_config_file={tmp}/bad.config"], "line 2:12", id="bad-config"),
        pytest.param(["--model_config_file={tmp}/none.config"], "cannot be read", id="missing-config"),
        pytest.param(
            ["--model_name=m", "--model_base_path=/x", "--batching_parameters_file={tmp}/bad.config"],
            "but --enable_batching is not",
            id="batching-without-enable",
        ),  # noqa: E501
        pytest.param(["--model_name=m", "--model_base_path=/x", "--port={taken}"], "is not available", id="port-taken"),
        pytest.param(["--model_name=m"], "expected --model_base_path", id="no-model"),
    ],
)
def test_bad_startup_is_a_one_line_error(flags, fragment, tmp_path):
    import socket

    from conftest import assert_one_line_error

    (tmp_path / "bad.config").write_text('model_config_list {\n  config { nme: "m" }\n}\n')
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        subs = {"tmp": tmp_path, "taken": taken.getsockname()[1]}
        proc = run_cli("serve-local", *[f.format(**subs) for f in flags], timeout=60)
    assert_one_line_error(proc, fragment)
    assert proc.returncode == 2
