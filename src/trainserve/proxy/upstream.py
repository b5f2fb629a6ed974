"""Whether TF Serving answers the proxy. Failures to reach it are counted per side (gRPC, REST) and logged once when
they start and once when they clear, with how many calls failed meanwhile: an outage is two lines in the log, not
one per call, and never silent. The readiness check is a real call over the proxy's own channel (its credentials,
its connection state), so a proxy whose calls cannot reach TF Serving, for an outage or a missing client
certificate, is not Ready."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import logging
import threading
import time
from collections import Counter

import grpc

from trainserve.protos import get_model_status_pb2

log = logging.getLogger(__name__)

GRPC, REST = "gRPC", "REST"
SIDES = (GRPC, REST)
GET_MODEL_STATUS = "/tensorflow.serving.ModelService/GetModelStatus"
AVAILABLE = get_model_status_pb2.ModelVersionStatus.AVAILABLE
# What TF Serving answers a status request about a model it does not know, or an empty one: it answered.
ANSWERS = frozenset({grpc.StatusCode.OK, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT})
PROBE_SECONDS = 2.0  # each readiness call's deadline: a whole check (gRPC, then REST) stays under 5 s


class UpstreamLog:
    """Calls that did not reach TF Serving (`failures` by side), and whether the last call of each side did."""

    def __init__(self, addresses: dict[str, str]):
        self.addresses = addresses
        self.failures: Counter = Counter({side: 0 for side in SIDES})
        self._outages: dict[str, list] = {}  # side -> [monotonic start, failed calls]
        self._lock = threading.Lock()

    def up(self, side: str) -> bool:
        return side not in self._outages

    def failed(self, side: str, reason: object) -> None:
        with self._lock:
            self.failures[side] += 1
            outage = self._outages.get(side)
            if outage is None:
                outage = self._outages[side] = [time.monotonic(), 0]
            outage[1] += 1
            first = outage[1] == 1
        if first:
            log.warning(
                "proxy: cannot reach TF Serving's %s at %s (%s); calls fail until it answers",
                side,
                self.addresses[side],
                reason,
            )

    def answered(self, side: str) -> None:
        if side not in self._outages:  # the common case: no lock taken on the request path
            return
        with self._lock:
            outage = self._outages.pop(side, None)
        if outage is not None:
            log.info(
                "proxy: TF Serving's %s at %s answers again, after %d failed call(s) over %.1f s",
                side,
                self.addresses[side],
                outage[1],
                time.monotonic() - outage[0],
            )


def reconnect_options(wait_s: float) -> list[tuple[str, int]]:
    """gRPC channel arguments that bound the reconnect backoff by `wait_s` (gRPC's default grows to 120 s, so an
    upstream back from an outage would be ignored for up to two minutes)."""
    wait_ms = max(1, int(wait_s * 1000))
    return [("grpc.initial_reconnect_backoff_ms", min(1000, wait_ms)), ("grpc.max_reconnect_backoff_ms", wait_ms)]


async def wait_reachable(channel: grpc.aio.Channel, wait_s: float | None) -> None:
    """Give a channel that is not connected up to `wait_s` to connect (a restarted TF Serving is used at once, not
    after the call failed); the call then goes ahead either way and fails as gRPC says if it still cannot."""
    if channel.get_state(try_to_connect=True) is grpc.ChannelConnectivity.READY or not wait_s or wait_s <= 0:
        return
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(channel.channel_ready(), wait_s)


def status_request(model: str) -> bytes:
    request = get_model_status_pb2.GetModelStatusRequest()
    if model:
        request.model_spec.name = model
    return request.SerializeToString()


async def grpc_answers(channel: grpc.aio.Channel, model: str, wait_s: float) -> tuple[bool, str | None]:
    """(whether a GetModelStatus over `channel` reached TF Serving, why it is not ready: None when TF Serving
    answered and, where `model` is named, a version of it is AVAILABLE)."""
    await wait_reachable(channel, min(wait_s, 1.0))
    try:
        answer = await channel.unary_unary(GET_MODEL_STATUS)(status_request(model), timeout=PROBE_SECONDS)
    except grpc.aio.AioRpcError as err:
        reason = f"{err.code().name}: {err.details()}"
        if err.code() not in ANSWERS:
            return False, reason
        return True, reason if model else None
    if not model:
        return True, None
    states = get_model_status_pb2.GetModelStatusResponse.FromString(answer).model_version_status
    return True, None if any(s.state == AVAILABLE for s in states) else f"no version of {model!r} AVAILABLE"


def rest_answers(address: str, model: str) -> tuple[bool, str | None]:
    """(whether a model status request reached TF Serving's REST port, why it is not ready: None when it answered,
    with 200 where `model` is named)."""
    connection = http.client.HTTPConnection(address, timeout=PROBE_SECONDS)
    try:
        connection.request("GET", f"/v1/models/{model or 'trainserve-readiness-check'}")
        answer = connection.getresponse()
        answer.read()
    except (OSError, http.client.HTTPException) as exc:
        return False, f"{type(exc).__name__}: {exc}"
    finally:
        connection.close()
    return True, None if not model or answer.status == 200 else f"HTTP {answer.status} for model {model!r}"
