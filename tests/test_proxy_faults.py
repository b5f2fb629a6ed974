"""`trainserve proxy` under the faults production brings (issue 45 item 7, the proxy's part of items 4 and 10):
an upstream outage (a real serve-local stopped and started again on the same ports), a shutdown with calls in
flight and records queued, trainserve's own calls. Every record is accounted for (offered = written + dropped +
lost), and no call waits on the capture."""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest

from conftest import Gate, free_port, install_version, save_gated_model
from serving_fixtures import InProcessServer, predict_request, running_proxy
from trainserve.proxy.config import FORMER_PATHS, LIVE_PATH, METRICS_PATH, READY_PATH
from trainserve.proxy.server import Proxy
from trainserve.tfrecord import iter_records
from trainserve.traffic import writer as writer_module
from trainserve.traffic.origin import REPLAY, origin_metadata

# The unit tests here: servers in this process; the one subprocess (the proxy) imports no TensorFlow.
PREDICT = "/tensorflow.serving.PredictionService/Predict"


def serve_on(model_dir: Path, port: int, rest_port: int, *flags: str) -> InProcessServer:
    """serve-local in this process on the given ports (so that a restarted one is found where the old one was)."""
    server = InProcessServer(f"--port={port}", f"--rest_api_port={rest_port}", *flags)
    server.port, server.rest_port = port, rest_port
    server.target, server.rest = f"127.0.0.1:{port}", f"http://127.0.0.1:{rest_port}"
    return server


def page(proxy: Proxy, path: str) -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", proxy.rest_port, timeout=30)
    try:
        connection.request("GET", path)
        answer = connection.getresponse()
        return answer.status, answer.read().decode()
    finally:
        connection.close()


def metric(text: str, name: str, **labels: str) -> float:
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    (line,) = [line for line in text.splitlines() if line.startswith(f"{name}{{") and wanted in line]
    return float(line.rsplit(" ", 1)[1])


def predict_code(channel: grpc.Channel, metadata=(), request=None) -> str:
    request = predict_request() if request is None else request
    try:
        channel.unary_unary(PREDICT)(request.SerializeToString(), timeout=30, metadata=metadata)
        return "OK"
    except grpc.RpcError as err:
        return err.code().name


def rest_predict(port: int, model: str = "m", body: dict | None = None) -> int:
    body = body or {"instances": [[[[0]] * 8] * 8]}
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request(
            "POST", f"/v1/models/{model}:predict", json.dumps(body), {"Content-Type": "application/json"}
        )
        answer = connection.getresponse()
        answer.read()
        return answer.status
    finally:
        connection.close()


class RefusingListener:
    """A TCP port that accepts and at once closes every connection (TF Serving's port during an outage, as a
    client's connection attempts see it), counting the attempts; `attempts` is set at the `n`th."""

    def __init__(self, port: int, n: int):
        self.sock = socket.create_server(("0.0.0.0", port), reuse_port=True)
        self.count, self.n, self.attempts = 0, n, threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.sock.accept()
            except OSError:  # closed
                return
            connection.close()
            self.count += 1
            if self.count >= self.n:
                self.attempts.set()

    def close(self) -> None:
        self.sock.close()
        self.thread.join(10)


@pytest.mark.integration
def test_an_upstream_outage_is_logged_once_readiness_follows_it_and_the_restarted_server_is_used_at_once(
    tmp_path, model_versions, caplog
):
    caplog.set_level(logging.INFO, logger="trainserve.proxy")
    install_version(model_versions[0], tmp_path / "m", 1)
    port, rest_port = free_port(), free_port()
    server = serve_on(tmp_path / "m", port, rest_port, "--model_name=m", f"--model_base_path={tmp_path / 'm'}")
    server.wait_available("m", 1)
    proxy = running_proxy(server, tmp_path / "captures" / "p", upstream_wait=0.25)
    failed_grpc = failed_rest = 0
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{proxy.port}")
        assert predict_code(channel) == "OK"
        assert page(proxy, READY_PATH)[0] == 200

        assert server.stop() == 0  # the outage
        assert [predict_code(channel) for _ in range(3)] == ["UNAVAILABLE"] * 3
        assert rest_predict(proxy.rest_port) == 502
        status, reason = page(proxy, READY_PATH)
        assert status == 503 and f"TF Serving's gRPC at {server.target}: UNAVAILABLE" in reason
        failed_grpc, failed_rest = 3 + 1, 1

        # The server's port answers connections and closes them: each reconnect attempt of the proxy is seen.
        # gRPC's own backoff (1 s, growing 1.6 x to 120 s) would take about 16 s for 6 attempts; bounded by
        # --upstream-wait 0.25 s they come in about 2 s.
        listener = RefusingListener(port, 6)
        try:
            while not listener.attempts.is_set():  # calls keep the channel trying; each waits --upstream-wait
                assert predict_code(channel, ()) == "UNAVAILABLE"
                failed_grpc += 1
                assert listener.attempts.wait(0) or failed_grpc < 200, "the proxy stopped trying to reconnect"
            assert listener.count >= 6
        finally:
            listener.close()
        server = serve_on(tmp_path / "m", port, rest_port, "--model_name=m", f"--model_base_path={tmp_path / 'm'}")
        server.wait_available("m", 1)
        # After six failed attempts gRPC's next one is 8 to 13 s away; the proxy's is at most 0.3 s away.
        proxy._call(asyncio.wait_for(proxy.channel.channel_ready(), 5), timeout=10)
        assert predict_code(channel) == "OK"
        assert rest_predict(proxy.rest_port) == 200
        assert page(proxy, READY_PATH)[0] == 200
        metrics = page(proxy, "/monitoring/proxy/metrics")[1]
        channel.close()
    finally:
        proxy.stop()
        server.stop()
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("trainserve.proxy")]
    for side, failed in (("gRPC", failed_grpc), ("REST", failed_rest)):
        assert len([line for line in lines if f"cannot reach TF Serving's {side}" in line]) == 1, lines
        (back,) = [line for line in lines if f"TF Serving's {side} at" in line and "answers again" in line]
        assert f"after {failed} failed call(s)" in back
        assert metric(metrics, ":trainserve:proxy:upstream_failures", side=side) == failed
        assert metric(metrics, ":trainserve:proxy:upstream_up", side=side) == 1


@pytest.fixture(scope="module")
def m_and_g(tmp_path_factory, model_versions):
    """serve-local with the tiny CNN as m and the gated model as g, for the tests that do not stop it."""
    from trainserve.model_server_config import render_model_config, single_model_config

    root = tmp_path_factory.mktemp("m-and-g")
    install_version(model_versions[0], root / "m", 1)
    install_version(save_gated_model(root / "gated"), root / "g", 1)
    config = single_model_config("m", str(root / "m"))
    config.model_config_list.config.add(name="g", base_path=str(root / "g"), model_platform="tensorflow")
    (root / "models.config").write_text(render_model_config(config))
    server = InProcessServer(f"--model_config_file={root / 'models.config'}")
    server.wait_available("m", 1)
    server.wait_available("g", 1)
    yield server
    assert server.stop() == 0


def gated_rest_call(port: int, gate: Gate, seen: dict) -> threading.Thread:
    """A REST Predict to g, held at `gate`; `seen` gets its HTTP status, or the error that ended it."""
    body = {"inputs": {key: str(value) for key, value in gate.inputs.items()}}

    def call() -> None:
        try:
            seen["rest"] = rest_predict(port, "g", body)
        except (OSError, http.client.HTTPException) as exc:
            seen["rest"] = repr(exc)

    caller = threading.Thread(target=call)
    caller.start()
    gate.wait_arrived()
    return caller


def gated_grpc_call(channel: grpc.Channel, gate: Gate, seen: dict) -> threading.Thread:
    """A gRPC Predict to g, held at `gate`; `seen` gets its status code's name."""
    from trainserve.protos import predict_pb2
    from trainserve.tensors import to_tensor_proto

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "g"
    for key, value in gate.inputs.items():
        to_tensor_proto(value, into=request.inputs[key])
    caller = threading.Thread(target=lambda: seen.update(grpc=predict_code(channel, (), request)))
    caller.start()
    gate.wait_arrived()
    return caller


@pytest.mark.unit
def test_sigterm_lets_a_rest_call_in_flight_finish_and_says_what_it_wrote(m_and_g, tmp_path):
    port, rest_port = free_port(), free_port()
    command = [sys.executable, "-m", "trainserve", "proxy", "--upstream", m_and_g.target, "--port", str(port)]
    command += ["--upstream-rest", m_and_g.rest.removeprefix("http://"), "--rest-port", str(rest_port)]
    command += ["--filename-prefix", str(tmp_path / "caps" / "p")]
    proxy = subprocess.Popen(
        command, stderr=subprocess.PIPE, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    )
    seen: dict = {}
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=60)
            assert [predict_code(channel) for _ in range(3)] == ["OK"] * 3
        (tmp_path / "gate").mkdir()
        gate = Gate(tmp_path / "gate")
        caller = gated_rest_call(rest_port, gate, seen)
        proxy.send_signal(signal.SIGTERM)
        lines = [proxy.stderr.readline()]
        while "proxy: stop" not in lines[-1]:  # "stopping": it waits for the call; "stopped": it did not
            lines.append(proxy.stderr.readline())
            assert lines[-1], "".join(lines)
        assert "stopping: 0 gRPC and 1 REST call(s) in flight" in lines[-1], "".join(lines)
        gate.open()
        caller.join(60)
        assert proxy.wait(timeout=60) == 0
    finally:
        if proxy.poll() is None:
            proxy.kill()
        proxy.wait()
    assert seen["rest"] == 200, seen  # serve-local's answer, passed on whole: the call was not cut
    rest = proxy.stderr.read()
    assert "0 gRPC and 0 REST call(s) cut" in rest, rest
    assert "records offered 3, written 3, dropped none, lost none, pending 0" in rest, rest


@pytest.mark.unit
def test_calls_in_flight_past_the_grace_are_cut_and_queued_records_lost_counted(m_and_g, tmp_path, monkeypatch):
    proxy = running_proxy(m_and_g, tmp_path / "captures" / "p")
    held, stuck = threading.Event(), threading.Event()
    real_write = writer_module.write_all

    def hung_volume(fd: int, data: bytes) -> None:  # every write into a capture file blocks: a hung volume
        stuck.set()
        held.wait(60)
        real_write(fd, data)

    monkeypatch.setattr(writer_module, "write_all", hung_volume)
    channel = grpc.insecure_channel(f"127.0.0.1:{proxy.port}")
    gates, seen = [], {}
    for name in ("rest", "grpc"):
        (tmp_path / name).mkdir()
        gates.append(Gate(tmp_path / name))
    try:
        assert [predict_code(channel) for _ in range(5)] == ["OK"] * 5  # no call waits on the hung volume
        assert stuck.wait(30)
        callers = [gated_rest_call(proxy.rest_port, gates[0], seen), gated_grpc_call(channel, gates[1], seen)]
        stopped = proxy.stop(grace=0.5)  # the gates stay shut: the grace runs out, deterministically
    finally:
        for gate in gates:
            gate.open()
        held.set()
    for caller in callers:
        caller.join(60)
    channel.close()
    assert (stopped.grpc_cut, stopped.rest_cut) == (1, 1)
    assert not isinstance(seen["rest"], int), seen  # the connection was closed under it: no HTTP answer
    assert seen["grpc"] in ("CANCELLED", "UNAVAILABLE"), seen
    records = stopped.records
    assert records.offered == 5 and records.pending == 0
    assert records.offered == records.written + sum(records.dropped.values()) + sum(records.lost.values())
    assert records.lost["shutdown"] == 5  # the one being written and the four queued behind it


@pytest.mark.unit
def test_trainserves_own_calls_are_forwarded_counted_and_never_recorded(m_and_g, tmp_path):
    proxy = running_proxy(m_and_g, tmp_path / "captures" / "p")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{proxy.port}") as channel:
            own = [predict_code(channel, origin_metadata(REPLAY)) for _ in range(3)]
            theirs = [predict_code(channel) for _ in range(2)]
        metrics = page(proxy, "/monitoring/proxy/metrics")[1]
    finally:
        records = proxy.stop().records
    assert own == theirs + ["OK"] == ["OK"] * 3
    assert (records.offered, records.written, records.skipped["origin"]) == (2, 2, 3)
    assert metric(metrics, ":trainserve:capture:calls_skipped", reason="origin") == 3
    assert on_disk(tmp_path / "captures") == 2


def on_disk(directory: Path) -> int:
    count = 0
    for path in directory.glob("*.tfrecord"):
        with open(path, "rb") as stream:
            count += sum(1 for _ in iter_records(stream))
    return count


@pytest.mark.unit
@pytest.mark.parametrize(
    "model, status, reason",
    [("m", 200, "ready"), ("", 200, "ready"), ("nope", 503, "TF Serving's gRPC at {target}: NOT_FOUND")],
    ids=["served-model", "any-answer", "unknown-model"],
)
def test_readiness_asks_for_the_named_model(m_and_g, tmp_path, model, status, reason):
    proxy = running_proxy(m_and_g, tmp_path / "captures" / "p", ready_model=model)
    try:
        answer = page(proxy, READY_PATH)
        metrics = page(proxy, "/monitoring/proxy/metrics")[1]
        former = [page(proxy, FORMER_PATHS[path])[0] for path in (READY_PATH, LIVE_PATH, METRICS_PATH)]
    finally:
        proxy.stop()
    assert answer[0] == status and answer[1].startswith(reason.format(target=m_and_g.target)), answer
    assert former == [status, 200, 200]  # the paths of its former name, `capture`, answer until the next release
    assert metric(metrics, ":trainserve:proxy:upstream_up", side="gRPC") == 1  # TF Serving answered either way
