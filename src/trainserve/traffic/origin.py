"""Calls that trainserve makes itself say so, and no capture records them.

Replay, eval and load send the request header `x-trainserve-origin` (gRPC metadata, or an HTTP header on REST) with
what they are. A capture (serve-local's `logging_config`, `trainserve proxy`) leaves such calls out of its files and
counts them apart: a replay against a capturing server would otherwise write its own calls into the capture it is
reading, and every later replay and drift run would take them for production traffic. Any client may set it, as
TF Serving's own clients set any metadata they like; the server answers the call as usual."""

from __future__ import annotations

from collections.abc import Iterable

ORIGIN_HEADER = "x-trainserve-origin"
REPLAY, EVAL, LOAD = "replay", "eval", "load"
ORIGINS = (REPLAY, EVAL, LOAD)


def origin_metadata(origin: str) -> tuple[tuple[str, str], ...]:
    """The gRPC metadata (or HTTP header) a trainserve client sends with each call it makes as `origin`."""
    if origin not in ORIGINS:
        raise ValueError(f"origin must be one of {', '.join(ORIGINS)}, not {origin!r}")
    return ((ORIGIN_HEADER, origin),)


def origin_of(metadata: Iterable[tuple[str, str]] | None) -> str | None:
    """The origin a call declared in its metadata or headers (names compared case-insensitively), or None."""
    for key, value in metadata or ():
        if key.lower() == ORIGIN_HEADER:
            return value
    return None
