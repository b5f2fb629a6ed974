"""Predict, pinned where asked, retrying what is worth retrying.

UNAVAILABLE, DEADLINE_EXCEEDED and RESOURCE_EXHAUSTED are retried with bounded exponential backoff and jitter;
anything else (INVALID_ARGUMENT, NOT_FOUND, ...) is raised at once with a message that says what was asked for.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass

import grpc
import numpy as np

from trainserve.client.target import RETRYABLE, RequestFailed, Target, rpc_status
from trainserve.protos import predict_pb2
from trainserve.tensors import from_tensor_proto, to_tensor_proto

log = logging.getLogger(__name__)

BACKOFF_BASE_S, BACKOFF_MAX_S = 0.25, 8.0


@dataclass(frozen=True)
class Prediction:
    """One Predict's answer."""

    version: int  # the version that answered
    outputs: dict[str, np.ndarray]
    latency_s: float  # of the attempt that was answered
    retries: int  # attempts that failed and were retried before it


def backoff_delay(attempt: int, rng: random.Random = random) -> float:
    """Seconds to wait before retry `attempt` (0-based): exponential, capped, with 'equal jitter'
    (half the step fixed, half random) so that many clients do not retry in lockstep."""
    step = min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2**attempt)
    return step / 2 + rng.uniform(0, step / 2)


def predict_request(
    target: Target, inputs: dict[str, np.ndarray], outputs: list[str] | None, version: int | None
) -> predict_pb2.PredictRequest:
    """A PredictRequest for `target`, pinned to `version` when it is not None (even 0)."""
    request = predict_pb2.PredictRequest()
    target.fill(request.model_spec, version)
    for key, value in inputs.items():
        to_tensor_proto(value, into=request.inputs[key])
    request.output_filter.extend(outputs or ())
    return request


def predict(
    prediction,
    request: predict_pb2.PredictRequest,
    target: Target,
    version: int | None,
    retries: int,
    timeout: float,
    wait_for_ready: bool = True,
) -> Prediction:
    """Send `request`, retrying up to `retries` times; `version` is what it pins (for the messages).
    `wait_for_ready`: while the server restarts, wait (within the deadline) for it to listen again; False: a server
    that does not listen is UNAVAILABLE at once (each retry then costs its backoff, not a whole deadline)."""
    for attempt in range(retries + 1):
        started = time.perf_counter()
        try:
            response = prediction.Predict(request, timeout=timeout, wait_for_ready=wait_for_ready)
        except grpc.RpcError as exc:
            if exc.code() not in RETRYABLE or attempt == retries:
                raise _failed(exc, target, version, attempt, timeout) from None
            log.debug("retrying after %s (attempt %d)", exc.code().name, attempt + 1)
            time.sleep(backoff_delay(attempt))
            continue
        latency = time.perf_counter() - started
        # Answers come as repeated *_val fields unless the server runs with
        # --enable_serialization_as_tensor_content (tensorflow/serving#1276); both decode here.
        decoded = {k: from_tensor_proto(v) for k, v in response.outputs.items()}
        return Prediction(response.model_spec.version.value, decoded, latency, attempt)
    raise AssertionError("unreachable: the last attempt returns or raises")


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
        return RequestFailed(f"Predict on {asked} failed after {attempt} retries: {rpc_status(exc)}{hint}", exc.code())
    return RequestFailed(f"Predict on {asked} rejected: {rpc_status(exc)}", exc.code())
