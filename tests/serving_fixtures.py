"""serve-local in the test's own process: `serve()` on a thread, answering real gRPC and REST on
free ports. The same surface as conftest.ServeLocal (the subprocess), so a test reads the same either way;
only what a process alone can show (signals, exit codes, flag parsing errors) needs the subprocess. Also the
gRPC client helpers the serving tests share."""

from __future__ import annotations

import logging
import math
import threading
from pathlib import Path

import grpc
import numpy as np
import pytest
from google.protobuf import wrappers_pb2

from conftest import Server, free_port
from trainserve.savedmodel import LoadedModel
from trainserve.tensors import to_tensor_proto

# What a third-party client sends: the tensorflow-serving-api wheel's stubs and messages, not ours. The wheel
# is imported where it is used: it imports TensorFlow, which a pytest worker should pay only when it needs it.
IMAGES = np.random.default_rng(5).integers(0, 256, (6, 8, 8, 1), dtype=np.uint8)


def stubs(server):
    from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

    channel = grpc.insecure_channel(server.target)
    return prediction_service_pb2_grpc.PredictionServiceStub(channel), model_service_pb2_grpc.ModelServiceStub(channel)


def predict_request(model="m", images=IMAGES, version=None, label=None, signature="", **inputs):
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = signature
    if version is not None:
        request.model_spec.version.CopyFrom(wrappers_pb2.Int64Value(value=version))
    if label is not None:
        request.model_spec.version_label = label
    for key, value in (inputs or {"images": images}).items():
        to_tensor_proto(value, into=request.inputs[key])
    return request


def expected(path: Path, images=IMAGES) -> dict[str, np.ndarray]:
    return LoadedModel(path).run("serving_default", {"images": images})


def rpc_error(call, *args) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        call(*args, timeout=30)
    return err.value


def server_options(*flags: str):
    """ServerOptions from serve-local's own command line, as `trainserve serve-local FLAGS` builds them."""
    from trainserve.cli import build_parser
    from trainserve.options import config_from_args
    from trainserve.serving.config import ServerOptions

    return config_from_args(ServerOptions, build_parser().parse_args(["serve-local", *flags]))


class LogLines(logging.Handler):
    """trainserve's log records while the server runs (what the subprocess tests read from its output)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


class InProcessServer(Server):
    """serve-local's `serve()` on a thread of this process, stopped through its `stop` event."""

    def __init__(self, *flags: str):
        from trainserve.serving.server import serve

        self.port, self.rest_port = free_port(), free_port()
        self.options = server_options(
            f"--port={self.port}", f"--rest_api_port={self.rest_port}", "--file_system_poll_wait_seconds=1", *flags
        )
        self.target = f"127.0.0.1:{self.port}"
        self.rest = f"http://127.0.0.1:{self.rest_port}"
        self._logger = logging.getLogger("trainserve")
        self._level = self._logger.level
        self._lines = LogLines()
        self._logger.addHandler(self._lines)
        self._logger.setLevel(logging.INFO)
        self._stop = threading.Event()
        self.exit_code: int | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, args=(serve,), name="serve-local", daemon=True)
        self._thread.start()

    def _serve(self, serve) -> None:
        try:
            self.exit_code = serve(self.options, self._stop)
        except BaseException as exc:  # reported by wait_for and stop
            self.error = exc

    def log(self) -> str:
        return "\n".join(self._lines.lines)

    def ended(self) -> str | None:
        return None if self._thread.is_alive() else f"ended ({self.exit_code}, {self.error!r})"

    def stop(self) -> int | None:
        """Stop as SIGTERM would (the drain included); returns serve()'s exit code."""
        self._stop.set()
        self._thread.join(timeout=60)
        self._logger.removeHandler(self._lines)
        self._logger.setLevel(self._level)
        if self.error is not None:
            raise self.error
        assert not self._thread.is_alive(), "serve-local did not stop within 60 s"
        return self.exit_code


@pytest.fixture(name="serve_in_process")
def serve_in_process_fixture():
    """Start in-process servers with serve-local's flags; each is stopped at teardown and must exit 0."""
    servers: list[InProcessServer] = []

    def start(*flags: str) -> InProcessServer:
        server = InProcessServer(*flags)
        servers.append(server)
        return server

    yield start
    for server in servers:
        assert server.stop() == 0


def serve_every_version(
    config: Path, model: str, base: Path, versions: tuple[int, ...], labels: dict[str, int] | None = None, *flags: str
) -> InProcessServer:
    """serve-local in process with every version of `model` under `base` loaded side by side
    (`model_version_policy { all {} }`, written to `config`) and `labels` set; returns once `versions` serve."""
    from trainserve.model_server_config import render_model_config, single_model_config

    served = single_model_config(model, str(base))
    entry = served.model_config_list.config[0]
    entry.model_version_policy.all.SetInParent()
    entry.version_labels.update(labels or {})
    config.write_text(render_model_config(served))
    server = InProcessServer(f"--model_config_file={config}", *flags)
    for version in versions:
        server.wait_available(model, version)
    return server


# The shadow's latency-based shedding (trainserve.proxy.shadow_headroom) off: it reads wall-clock latencies, so on a
# loaded test machine it would shed a share of copies that varies from run to run. Tests that count copies, or
# judge a rollout on them, use this; tests/test_shadow_shedding.py drives the rule with an injected clock.
NO_LATENCY_SHED = {"shadow_shed_latency_margin": math.inf}


def running_proxy(upstream: Server, prefix: Path, uniform=None, **fields):
    """`trainserve proxy` in process in front of `upstream` (gRPC and REST), writing under `prefix`; `fields` are
    ProxyConfig's (tls, routing_file, ...), `uniform` the sampling and routing draws (seeded in tests)."""
    from trainserve.proxy.config import ProxyConfig
    from trainserve.proxy.server import Proxy

    config = ProxyConfig(
        upstream=upstream.target,
        upstream_rest=upstream.rest.removeprefix("http://"),
        port=0,
        rest_port=0,
        filename_prefix=str(prefix),
        **{**NO_LATENCY_SHED, **fields},
    )
    return Proxy(config, uniform=uniform)
