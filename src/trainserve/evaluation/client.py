"""A gRPC client for TF Serving (real or serve-local): wait for a model, read its signature, predict.

Retries what is worth retrying (UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED) with bounded
exponential backoff and jitter; anything else (INVALID_ARGUMENT, NOT_FOUND, ...) is raised at once
with a message that says what was asked for.

TensorFlow-free: the messages and stubs come from trainserve.protos (generated from the pinned
tensorflow-serving-api), so the client starts in a fraction of a second with a small footprint.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np

from trainserve.errors import TrainserveError
from trainserve.protos import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)
from trainserve.savedmodel import TensorSpecInfo, tensor_info
from trainserve.tensors import from_tensor_proto, to_tensor_proto

log = logging.getLogger(__name__)

RETRYABLE = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED}
)
BACKOFF_BASE_S, BACKOFF_MAX_S = 0.25, 8.0


@dataclass(frozen=True)
class Target:
    """Which model, version or label, and signature a run asks for."""

    model: str
    version: int | None = None
    label: str | None = None
    signature: str = "serving_default"

    def describe(self) -> str:
        which = f" version {self.version}" if self.version is not None else ""
        which += f" label {self.label!r}" if self.label else ""
        return f"model {self.model!r}{which}"

    def fill(self, model_spec, version: int | None = None) -> None:
        model_spec.name = self.model
        model_spec.signature_name = self.signature
        pinned = version if version is not None else self.version
        # `is not None`: a set version, even 0, asks for exactly that one; only an unset one means the
        # newest (ServerCore::ServableRequestFromModelSpec in tensorflow/serving).
        if pinned is not None:
            model_spec.version.SetInParent()  # present even when 0
            model_spec.version.value = pinned
        elif self.label:
            model_spec.version_label = self.label


@dataclass(frozen=True)
class Signature:
    """A SignatureDef's input and output tensors, by key."""

    inputs: dict[str, TensorSpecInfo]
    outputs: dict[str, TensorSpecInfo]


@dataclass(frozen=True)
class Prediction:
    """One Predict's answer."""

    version: int  # the version that answered
    outputs: dict[str, np.ndarray]
    latency_s: float  # of the attempt that was answered
    retries: int  # attempts that failed and were retried before it


class RequestFailed(TrainserveError):
    """A request that failed for good; `code` is the last gRPC status."""

    def __init__(self, message: str, code: grpc.StatusCode):
        super().__init__(message)
        self.code = code


def backoff_delay(attempt: int, rng: random.Random = random) -> float:
    """Seconds to wait before retry `attempt` (0-based): exponential, capped, with 'equal jitter'
    (half the step fixed, half random) so that many clients do not retry in lockstep."""
    step = min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2**attempt)
    return step / 2 + rng.uniform(0, step / 2)


class ServingClient:
    """One channel to a server; thread-safe (gRPC stubs are)."""

    def __init__(self, server: str, max_message_bytes: int, tls_ca: Path | None = None, timeout: float = 10.0):
        self.server, self.timeout = server, timeout
        # Status and metadata calls are cheap and few: --timeout (per Predict attempt) must not starve them.
        self.control_timeout = max(timeout, 5.0)
        options = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
        ]
        if tls_ca is not None:
            try:
                credentials = grpc.ssl_channel_credentials(root_certificates=Path(tls_ca).read_bytes())
            except OSError as exc:
                raise TrainserveError(
                    f"--tls-ca {tls_ca} cannot be read ({exc.strerror}): expected a PEM file"
                ) from None
            self.channel = grpc.secure_channel(server, credentials, options=options)
        else:
            self.channel = grpc.insecure_channel(server, options=options)
        self.prediction = prediction_service_pb2_grpc.PredictionServiceStub(self.channel)
        self.models = model_service_pb2_grpc.ModelServiceStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def wait_until_available(self, target: Target, wait_s: float) -> int:
        """Poll GetModelStatus until the asked-for version is AVAILABLE; returns that version."""
        deadline = time.monotonic() + wait_s
        last = "no answer yet"
        while True:
            request = get_model_status_pb2.GetModelStatusRequest()
            target.fill(request.model_spec)
            request.model_spec.ClearField("signature_name")
            try:
                response = self.models.GetModelStatus(request, timeout=min(self.control_timeout, max(wait_s, 0.1)))
                states = response.model_version_status
                available = [s.version for s in states if s.state == get_model_status_pb2.ModelVersionStatus.AVAILABLE]
                if available:
                    return max(available)
                last = "no version AVAILABLE yet"
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND and target.version is None:
                    raise RequestFailed(
                        f"{target.describe()} not found on {self.server}: {exc.details()}", exc.code()
                    ) from None
                if exc.code() not in RETRYABLE | {grpc.StatusCode.NOT_FOUND}:
                    raise RequestFailed(f"GetModelStatus for {target.describe()}: {_status(exc)}", exc.code()) from None
                last = _status(exc)
            if time.monotonic() >= deadline:
                raise TrainserveError(
                    f"{target.describe()} not AVAILABLE on {self.server} within --wait {wait_s:g} s ({last}): "
                    "expected a reachable server serving it"
                )
            time.sleep(0.25)

    def signature(self, target: Target, version: int | None) -> Signature:
        """The SignatureDef the run will call, from GetModelMetadata (as TF Serving packs it); version None:
        the target's own (newest or labelled)."""
        request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        target.fill(request.model_spec, version)
        request.model_spec.ClearField("signature_name")
        try:
            response = self.prediction.GetModelMetadata(request, timeout=self.control_timeout)
        except grpc.RpcError as exc:
            raise RequestFailed(f"GetModelMetadata for {target.describe()}: {_status(exc)}", exc.code()) from None
        asked = target.describe() if version is None else f"{target.describe()} version {version}"
        defs = _signature_defs(response, asked)
        if target.signature not in defs:
            names = sorted(k for k in defs if not k.startswith("__"))
            raise TrainserveError(
                f"signature {target.signature!r} not found in {asked}: expected one of {', '.join(names)}"
            )
        sig = defs[target.signature]
        return Signature(
            {k: tensor_info(k, v) for k, v in sig.inputs.items()},
            {k: tensor_info(k, v) for k, v in sig.outputs.items()},
        )

    def predict(
        self, target: Target, inputs: dict[str, np.ndarray], outputs: list[str], version: int | None, retries: int
    ) -> Prediction:
        """One Predict of `outputs` from `version` (None: the target's), retrying what is worth retrying."""
        request = predict_pb2.PredictRequest()
        target.fill(request.model_spec, version)
        for key, value in inputs.items():
            to_tensor_proto(value, into=request.inputs[key])
        request.output_filter.extend(outputs)
        for attempt in range(retries + 1):
            started = time.perf_counter()
            try:
                # wait_for_ready: while the server restarts, wait (within the deadline) for it to listen again.
                response = self.prediction.Predict(request, timeout=self.timeout, wait_for_ready=True)
            except grpc.RpcError as exc:
                if exc.code() not in RETRYABLE or attempt == retries:
                    raise _failed(exc, target, version, attempt, self.timeout) from None
                log.debug("retrying after %s (attempt %d)", exc.code().name, attempt + 1)
                time.sleep(backoff_delay(attempt))
                continue
            latency = time.perf_counter() - started
            # Answers come as repeated *_val fields unless the server runs with
            # --enable_serialization_as_tensor_content (tensorflow/serving#1276); both decode here.
            decoded = {k: from_tensor_proto(v) for k, v in response.outputs.items()}
            return Prediction(response.model_spec.version.value, decoded, latency, attempt)
        raise AssertionError("unreachable: the last attempt returns or raises")


def _signature_defs(response, asked: str):
    """The SignatureDefMap TF Serving packs in an Any under "signature_def", checked by its type name."""
    packed = response.metadata.get("signature_def")
    wanted = get_model_metadata_pb2.SignatureDefMap.DESCRIPTOR.full_name
    if packed is None or packed.type_url.rpartition("/")[2] != wanted:
        got = "nothing" if packed is None else repr(packed.type_url)
        raise TrainserveError(f"GetModelMetadata for {asked} answered {got} under 'signature_def': expected a {wanted}")
    return get_model_metadata_pb2.SignatureDefMap.FromString(packed.value).signature_def


def _status(exc: grpc.RpcError) -> str:
    return f"{exc.code().name}: {exc.details()}"


def _failed(exc: grpc.RpcError, target: Target, version: int | None, attempt: int, timeout: float) -> RequestFailed:
    asked = target.describe() if version is None else f"model {target.model!r} version {version}"
    if exc.code() == grpc.StatusCode.NOT_FOUND:
        unloaded = (
            " (it was unloaded mid-run: serve with latest { num_versions: 2 } so a pinned evaluation can finish)"
            if version is not None and target.version is None
            else ""
        )
        return RequestFailed(f"{asked} not found: {exc.details()}{unloaded}", exc.code())
    if exc.code() in RETRYABLE:
        hint = f" (is --timeout {timeout:g} s long enough?)" if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED else ""
        return RequestFailed(f"Predict on {asked} failed after {attempt} retries: {_status(exc)}{hint}", exc.code())
    return RequestFailed(f"Predict on {asked} rejected: {_status(exc)}", exc.code())
