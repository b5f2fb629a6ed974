"""What a server says about a model's versions and labels, and the one loop that waits on it.

GetModelStatus answers for versions only: TF Serving reads the ModelSpec's name and version there and ignores
its version_label (model_servers/get_model_status_impl.cc), so a status asked "for a label" lists every version.
A label is resolved with GetModelMetadata, which resolves it as Predict does
(ServerCore::ServableRequestFromModelSpec) and answers with the version behind it, loaded.

A server that is not up yet answers UNAVAILABLE, and the loop waits; a server that refused this client's TLS
(or its plaintext) answers UNAVAILABLE too, but waiting will not change its mind: each UNAVAILABLE is read by
`describe_refusal`, and a refusal ends the wait at once with the line that names it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import grpc

from trainserve.client.load_watch import LoadWatch
from trainserve.client.refusal import describe_refusal
from trainserve.client.target import RETRYABLE, RequestFailed, Target, pin_version, rpc_status
from trainserve.errors import TrainserveError
from trainserve.protos import get_model_metadata_pb2, get_model_status_pb2
from trainserve.tls import ClientTls

POLL_S = 0.25
State = get_model_status_pb2.ModelVersionStatus.State
# What GetModelMetadata answers for a label the server does not know (yet): TF Serving INVALID_ARGUMENT
# ("Unrecognized servable version label"), or NOT_FOUND while the version behind it is not loaded.
LABEL_UNKNOWN = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND})


@dataclass(frozen=True)
class Seen:
    """One look at the server: the version found (None: not there yet) and what the server said, quoted by the
    message that ends a wait which ran out."""

    version: int | None
    said: str


def poll(
    look: Callable[[], Seen],
    done: Callable[[Seen], bool],
    wait_s: float,
    watch: Callable[[int | None, str], None] | None = None,
) -> Seen:
    """Look every POLL_S seconds until `done` or `wait_s` seconds have passed; the last look. An answer that
    settles the question early (a failed load, an unknown model) is raised by `look` itself. `watch` is told
    each look (a LoadWatch: what a person sees of the wait)."""
    deadline = time.monotonic() + wait_s
    while True:
        seen = look()
        if watch is not None:
            watch(seen.version, seen.said)
        if done(seen) or time.monotonic() >= deadline:
            return seen
        time.sleep(POLL_S)


class ModelStatus:
    """One server's answers about versions and labels, and the waits built on them."""

    def __init__(self, models, prediction, server: str, timeout: float, tls: ClientTls | None = None):
        self.models, self.prediction, self.server, self.timeout, self.tls = models, prediction, server, timeout, tls

    def version_states(self, model: str, version: int | None = None) -> list:
        """GetModelStatus: every version's ModelVersionStatus, or only `version`'s; raises grpc.RpcError."""
        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = model
        if version is not None:
            pin_version(request.model_spec, version)
        return list(self.models.GetModelStatus(request, timeout=self.timeout).model_version_status)

    def label_version(self, model: str, label: str) -> int:
        """The version the server resolves `label` to now (GetModelMetadata); raises grpc.RpcError."""
        request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        request.model_spec.name, request.model_spec.version_label = model, label
        return self.prediction.GetModelMetadata(request, timeout=self.timeout).model_spec.version.value

    def wait_for(self, target: Target, wait_s: float) -> int:
        """Until the version the target names is AVAILABLE: the pinned one, the one behind its label, or the newest;
        returns it. An unknown model or label fails at once: the server has answered."""
        if target.version is not None:
            look = partial(self._look_version, target.model, target.version)
        elif target.label:
            look = partial(self.look_label, target.model, target.label, may_appear=False)
        else:
            look = partial(self._look_newest, target.model)
        return self._available(look, target.describe(), wait_s, "expected a reachable server serving it")

    def wait_available(self, model: str, version: int, wait_s: float) -> None:
        """Until `version` is AVAILABLE (a rollout step's load); a failed load fails at once, naming its error."""
        what, expected = f"model {model} version {version}", "expected the server to poll the config and load it"
        watch, loaded = LoadWatch(what, self.server, wait_s), False
        try:
            self._available(partial(self._look_version, model, version), what, wait_s, expected, watch)
            loaded = True
        finally:
            watch.close(loaded)

    def wait_label(self, model: str, label: str, version: int, wait_s: float) -> None:
        """Until the server resolves `label` to `version` (a rollout step's label move)."""
        seen = poll(partial(self.look_label, model, label, may_appear=True), lambda s: s.version == version, wait_s)
        if seen.version != version:
            now = f"version {seen.version}" if seen.version is not None else f"nothing ({seen.said})"
            raise TrainserveError(
                f"{self.server}: label {label!r} of model {model} resolves to {now} after --wait {wait_s:g} s, "
                f"expected version {version}: is the server polling this config file "
                "(--model_config_file_poll_wait_seconds)?"
            )

    def wait_unloaded(self, model: str, version: int, wait_s: float) -> None:
        """Until the server no longer serves `version` (END, or unknown to it): a rollback's wait before the routing
        that keeps requests naming no version on stable is removed."""
        seen = poll(partial(self._look_serving, model, version), lambda s: s.version is None, wait_s)
        if seen.version is not None:
            raise TrainserveError(
                f"{self.server}: model {model} version {version} still served after --wait {wait_s:g} s "
                f"({seen.said}): expected the server to poll the config and unload it"
            )

    def _look_serving(self, model: str, version: int) -> Seen:
        """`version` while the server may still answer with it; None once it is gone."""
        try:
            states = self.version_states(model, version)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return Seen(None, "unknown to the server")
            if exc.code() in RETRYABLE:
                self._not_yet(exc)
                return Seen(version, rpc_status(exc))  # cannot tell yet
            raise RequestFailed(
                f"GetModelStatus for model {model} version {version}: {rpc_status(exc)}", exc.code()
            ) from None
        serving = [s for s in states if s.version == version and s.state != State.END]
        return Seen(version if serving else None, f"state {State.Name(serving[0].state)}" if serving else "END")

    def _available(
        self, look: Callable[[], Seen], what: str, wait_s: float, expected: str, watch: LoadWatch | None = None
    ) -> int:
        seen = poll(look, lambda s: s.version is not None, wait_s, watch)
        if seen.version is None:
            raise TrainserveError(
                f"{what} not AVAILABLE on {self.server} within --wait {wait_s:g} s ({seen.said}): {expected}"
            )
        return seen.version

    def _not_yet(self, exc: grpc.RpcError) -> Seen:
        """An answer worth waiting out, unless it is the server refusing this client's TLS (or its plaintext)."""
        refused = describe_refusal(exc, self.server, self.tls)
        if refused is not None:
            raise RequestFailed(refused, exc.code())
        return Seen(None, rpc_status(exc))

    def _look_version(self, model: str, version: int) -> Seen:
        try:
            states = self.version_states(model, version)
        except grpc.RpcError as exc:
            if exc.code() in RETRYABLE | {grpc.StatusCode.NOT_FOUND}:  # NOT_FOUND: not offered to the server yet
                return self._not_yet(exc)
            raise RequestFailed(
                f"GetModelStatus for model {model} version {version}: {rpc_status(exc)}", exc.code()
            ) from None
        for status in states:
            if status.version != version:
                continue
            if status.state == State.END and status.status.error_message:
                raise TrainserveError(
                    f"{self.server}: model {model} version {version} failed to load: {status.status.error_message}"
                )
            return Seen(version if status.state == State.AVAILABLE else None, f"state {State.Name(status.state)}")
        return Seen(None, "unknown to the server")

    def _look_newest(self, model: str) -> Seen:
        try:
            states = self.version_states(model)
        except grpc.RpcError as exc:
            if exc.code() in RETRYABLE:
                return self._not_yet(exc)
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                raise RequestFailed(
                    f"model {model!r} not found on {self.server}: {exc.details()}", exc.code()
                ) from None
            raise RequestFailed(f"GetModelStatus for model {model!r}: {rpc_status(exc)}", exc.code()) from None
        available = [s.version for s in states if s.state == State.AVAILABLE]
        return Seen(max(available, default=None), "no version AVAILABLE yet")

    def look_label(self, model: str, label: str, may_appear: bool) -> Seen:
        """`may_appear`: an unknown label is "not yet" (a rollout moving it) rather than an answer."""
        try:
            return Seen(self.label_version(model, label), f"label {label!r} resolved")
        except grpc.RpcError as exc:
            if exc.code() in RETRYABLE or (may_appear and exc.code() in LABEL_UNKNOWN):
                return self._not_yet(exc)
            if exc.code() in LABEL_UNKNOWN:
                raise RequestFailed(
                    f"label {label!r} of model {model!r} not found on {self.server}: {exc.details()}", exc.code()
                ) from None
            raise RequestFailed(
                f"GetModelMetadata for model {model!r} label {label!r}: {rpc_status(exc)}", exc.code()
            ) from None
