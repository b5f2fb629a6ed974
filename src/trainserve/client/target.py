"""What a request names: a model, and a version, a label or neither (the newest), and a signature; and the
error a request that failed for good raises."""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from trainserve.errors import TrainserveError
from trainserve.layout import DEFAULT_SIGNATURE

# Worth asking again: the server is (re)starting, busy, or was slow this once.
RETRYABLE = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED}
)


@dataclass(frozen=True)
class Target:
    """Which model, version or label, and signature a run asks for."""

    model: str
    version: int | None = None
    label: str | None = None
    signature: str = DEFAULT_SIGNATURE

    def describe(self) -> str:
        which = f" version {self.version}" if self.version is not None else ""
        which += f" label {self.label!r}" if self.label else ""
        return f"model {self.model!r}{which}"

    def fill(self, model_spec, version: int | None = None) -> None:
        """Name the target in a ModelSpec; `version` (when not None) pins that version instead of the target's."""
        model_spec.name = self.model
        model_spec.signature_name = self.signature
        pinned = version if version is not None else self.version
        if pinned is not None:
            pin_version(model_spec, pinned)
        elif self.label:
            model_spec.version_label = self.label


def pin_version(model_spec, version: int) -> None:
    """A set version, even 0, asks for exactly that one; only an unset one means the newest
    (ServerCore::ServableRequestFromModelSpec in tensorflow/serving)."""
    model_spec.version.SetInParent()  # present even when 0
    model_spec.version.value = version


class RequestFailed(TrainserveError):
    """A request that failed for good; `code` is the last gRPC status."""

    def __init__(self, message: str, code: grpc.StatusCode):
        super().__init__(message)
        self.code = code


def rpc_status(exc: grpc.RpcError) -> str:
    """`CODE: details`, as a message quotes a server's answer."""
    return f"{exc.code().name}: {exc.details()}"
