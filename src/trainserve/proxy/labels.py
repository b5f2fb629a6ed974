"""Which version a version label names, asked of TF Serving's REST API, so that REST traffic is counted by version
without any gRPC answer to learn it from (a REST predict answer does not say which version gave it).

`GET /v1/models/<name>/labels/<label>/metadata` answers GetModelMetadataResponse as JSON, whose `model_spec.version`
is the version the label resolves to (`/v1/models/<name>/metadata`, for the label "": the version a request naming
none gets) (tensorflow_serving/model_servers/http_rest_api_util.cc routes the label to
GetModelMetadataImpl, which sets the response's model_spec from the servable it resolved). The status API
(`/labels/<label>` without `/metadata`) ignores the label and lists every version, so it cannot answer this.
Each (model, label) is asked at most once per `max_age_s` (a label moves when TF Serving re-reads its config);
one thread asks while the others count with the version known so far.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable

MAX_AGE_S = 1.0  # a moved label is counted under its new version within this, plus TF Serving's own poll
ASK_TIMEOUT_S = 2.0


def label_version(address: str, model: str, label: str, timeout_s: float = ASK_TIMEOUT_S) -> str | None:
    """The version `label` ("": none) names at the REST API on `address` (host:port), as a string; None when it
    does not answer one (an unknown label or model, TF Serving unreachable, an answer without a version). `model`
    and `label` are path segments as a client sent them (URL-encoded already)."""
    path = f"/v1/models/{model}" + (f"/labels/{label}/metadata" if label else "/metadata")
    connection = http.client.HTTPConnection(address, timeout=timeout_s)
    try:
        connection.request("GET", path)
        answer = connection.getresponse()
        body = answer.read()
    except (OSError, http.client.HTTPException):
        return None
    finally:
        connection.close()
    if answer.status != 200:
        return None
    try:
        version = json.loads(body)["model_spec"]["version"]
    except (ValueError, KeyError, TypeError):
        return None
    return str(version) if str(version).isdigit() else None


class LabelVersions:
    """The version each (model, label) named when last asked; `version()` asks again once the answer is older than
    `max_age_s`. Keys come only from calls that TF Serving answered, so clients cannot grow the table."""

    def __init__(
        self,
        ask: Callable[[str, str], str | None],
        max_age_s: float = MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.ask, self.max_age_s, self.clock = ask, max_age_s, clock
        self._known: dict[tuple[str, str], tuple[str | None, float]] = {}
        self._asking: dict[tuple[str, str], threading.Lock] = {}
        self._lock = threading.Lock()

    def version(self, model: str, label: str) -> str | None:
        """The version `label` names, asked again if the last answer is older than max_age_s; while one thread
        asks, the others get the last answer (None before the first: they wait for it)."""
        key = (model, label)
        with self._lock:
            known = self._known.get(key)
            asking = self._asking.setdefault(key, threading.Lock())
        if known is not None and self.clock() - known[1] < self.max_age_s:
            return known[0]
        if not asking.acquire(blocking=known is None):
            return known[0]
        try:
            with self._lock:
                latest = self._known.get(key)
            if latest is not None and latest is not known:  # another thread asked while this one waited
                return latest[0]
            version = self.ask(model, label)
            with self._lock:
                self._known[key] = (version, self.clock())
            return version
        finally:
            asking.release()
