"""serve-local in the test's own process: `serve()` on a thread, answering real gRPC and REST on
free ports. The same surface as conftest.ServeLocal (the subprocess), so a test reads the same either way;
only what a process alone can show (signals, exit codes, flag parsing errors) needs the subprocess."""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request

import pytest

from conftest import DIRECT, free_port


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


class InProcessServer:
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

    def alive(self) -> bool:
        return self._thread.is_alive()

    def get(self, path: str) -> tuple[int, dict]:
        try:
            with DIRECT.open(self.rest + path, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    def post(self, path: str, body: dict) -> tuple[int, dict]:
        request = urllib.request.Request(self.rest + path, json.dumps(body).encode(), method="POST")
        try:
            with DIRECT.open(request, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    def wait_for(self, predicate, what: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.alive(), f"serve-local ended ({self.exit_code}, {self.error!r}):\n{self.log()}"
            try:
                if predicate():
                    return
            except (OSError, urllib.error.URLError, ValueError):
                pass
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}:\n{self.log()}")

    def versions(self, model: str) -> dict[int, str]:
        status, body = self.get(f"/v1/models/{model}")
        return {int(v["version"]): v["state"] for v in body.get("model_version_status", [])} if status == 200 else {}

    def wait_available(self, model: str, version: int, timeout: float = 90) -> None:
        self.wait_for(lambda: self.versions(model).get(version) == "AVAILABLE", f"{model} v{version}", timeout)

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
