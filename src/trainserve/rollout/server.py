"""Watch the server apply a rollout change: a version loaded, a label moved.

The config is polled by the server (`--model_config_file_poll_wait_seconds`), so a rewrite takes effect
some seconds later; a candidate's label may only be set once its version is AVAILABLE (TF Serving
refuses to move a label to a version that is not), so staging waits here between its two writes.
GetModelStatus answers for versions (TF Serving ignores a label there); GetModelMetadata resolves a
label to the version behind it, as Predict does.
"""

from __future__ import annotations

import time

import grpc

from trainserve.errors import TrainserveError
from trainserve.protos import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    prediction_service_pb2_grpc,
)

POLL_SECONDS = 0.5
RPC_TIMEOUT = 10.0
NOT_YET = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAVAILABLE)
State = get_model_status_pb2.ModelVersionStatus.State


class ServingServer:
    """A TF Serving (or serve-local) gRPC endpoint, asked about one model's versions and labels."""

    def __init__(self, target: str):
        self.target = target
        self.channel = grpc.insecure_channel(target)
        self.models = model_service_pb2_grpc.ModelServiceStub(self.channel)
        self.predictions = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)

    def version_state(self, model: str, version: int) -> tuple[int | None, str]:
        """(ModelVersionStatus.State, error message) of one version; (None, "") while the server does not know it."""
        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = model
        request.model_spec.version.value = version
        try:
            response = self.models.GetModelStatus(request, timeout=RPC_TIMEOUT)
        except grpc.RpcError as exc:
            if exc.code() in NOT_YET:
                return None, ""
            raise
        for status in response.model_version_status:
            if status.version == version:
                return status.state, status.status.error_message
        return None, ""

    def label_version(self, model: str, label: str) -> int | None:
        """The version the server resolves `label` to now, or None (label unknown, version not loaded)."""
        request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        request.model_spec.name = model
        request.model_spec.version_label = label
        try:
            return self.predictions.GetModelMetadata(request, timeout=RPC_TIMEOUT).model_spec.version.value
        except grpc.RpcError as exc:
            if exc.code() in NOT_YET:
                return None
            raise

    def wait_available(self, model: str, version: int, wait: float) -> None:
        """Until `version` is AVAILABLE; a failed load (END with an error) fails at once, naming the error."""

        def loaded(answer: tuple[int | None, str]) -> bool:
            state, error = answer
            if state == State.END and error:
                raise TrainserveError(f"{self.target}: model {model} version {version} failed to load: {error}")
            return state == State.AVAILABLE

        state, _ = self._poll(lambda: self.version_state(model, version), loaded, wait)
        if state != State.AVAILABLE:
            raise TrainserveError(
                f"{self.target}: model {model} version {version} is not AVAILABLE after {wait:g} s "
                f"(state {'unknown to the server' if state is None else State.Name(state)}): expected the server "
                "to poll the config and load it (--wait to wait longer)"
            )

    def wait_label(self, model: str, label: str, version: int, wait: float) -> None:
        """Until the server resolves `label` to `version`."""
        seen = self._poll(lambda: self.label_version(model, label), lambda answer: answer == version, wait)
        if seen != version:
            raise TrainserveError(
                f"{self.target}: label {label!r} of model {model} resolves to "
                f"{'nothing' if seen is None else f'version {seen}'} after {wait:g} s, expected version {version}: "
                "is the server polling this config file (--model_config_file_poll_wait_seconds)?"
            )

    def _poll(self, ask, done, wait: float):
        """Ask every POLL_SECONDS until `done(answer)` or `wait` seconds have passed; the last answer."""
        deadline = time.monotonic() + wait
        while True:
            answer = self._ask(ask)
            if done(answer) or time.monotonic() >= deadline:
                return answer
            time.sleep(POLL_SECONDS)

    def _ask(self, call):
        try:
            return call()
        except grpc.RpcError as exc:
            raise TrainserveError(f"{self.target}: {exc.code().name}: {exc.details()}") from None

    def close(self) -> None:
        self.channel.close()
