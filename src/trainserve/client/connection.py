"""ServingClient: one channel to one server, and everything a stage asks of it."""

from __future__ import annotations

import grpc
import numpy as np

from trainserve.client.channel import MAX_MESSAGE_BYTES, open_channel, with_origin
from trainserve.client.predict import Prediction, predict, predict_request
from trainserve.client.signature import Signature, read_signature
from trainserve.client.status import ModelStatus
from trainserve.client.target import Target
from trainserve.protos import model_service_pb2_grpc, prediction_service_pb2_grpc
from trainserve.tls import ClientTls


class ServingClient:
    """A TF Serving (or serve-local) gRPC endpoint; thread-safe (gRPC stubs are).

    `channel`: one built by the caller (e.g. `open_channel` wrapped with grpc.intercept_channel); by default
    `open_channel(server, tls, max_message_bytes)`. `tls` also tells the waits how to read a refusal. `origin`
    (replay, eval, load: trainserve.traffic.origin) is sent with every call, so no capture records trainserve's own
    traffic as production's.
    """

    def __init__(
        self,
        server: str,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        tls: ClientTls | None = None,
        timeout: float = 10.0,
        channel: grpc.Channel | None = None,
        origin: str | None = None,
    ):
        self.server, self.timeout = server, timeout
        channel = channel if channel is not None else open_channel(server, tls, max_message_bytes)
        self.channel = with_origin(channel, origin)
        self.prediction = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)
        # Status and metadata calls are cheap and few: the per-Predict timeout must not starve them.
        self.status = ModelStatus(
            model_service_pb2_grpc.ModelServiceStub(self.channel), self.prediction, server, max(timeout, 5.0), tls
        )

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> ServingClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def wait_until_available(self, target: Target, wait_s: float) -> int:
        """Until the version `target` names is AVAILABLE; that version (behind a label: from GetModelMetadata)."""
        return self.status.wait_for(target, wait_s)

    def wait_available(self, model: str, version: int, wait_s: float) -> None:
        self.status.wait_available(model, version, wait_s)

    def wait_label(self, model: str, label: str, version: int, wait_s: float) -> None:
        self.status.wait_label(model, label, version, wait_s)

    def wait_unloaded(self, model: str, version: int, wait_s: float) -> None:
        self.status.wait_unloaded(model, version, wait_s)

    def label_version(self, model: str, label: str) -> int | None:
        """The version the server resolves `label` to now; None while it resolves it to none (an unknown label,
        a version not loaded, a server not up)."""
        return self.status.look_label(model, label, may_appear=True).version

    def signature(self, target: Target, version: int | None) -> Signature:
        """The SignatureDef the run will call; version None: the target's own (pinned, labelled or the newest)."""
        return read_signature(self.prediction, target, version, self.status.timeout)

    def predict(
        self, target: Target, inputs: dict[str, np.ndarray], outputs: list[str], version: int | None, retries: int
    ) -> Prediction:
        """One Predict of `outputs` from `version` (None: the target's), retrying what is worth retrying."""
        request = predict_request(target, inputs, outputs, version)
        return predict(self.prediction, request, target, version, retries, self.timeout)
