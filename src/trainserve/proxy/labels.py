"""Which version a version label names, asked of TF Serving's REST API, so that REST traffic is counted by version
without any gRPC answer to learn it from (a REST predict answer does not say which version gave it).

`GET /v1/models/<name>/labels/<label>/metadata` answers GetModelMetadataResponse as JSON, whose `model_spec.version`
is the version the label resolves to (`/v1/models/<name>/metadata`, for the label "": the version a request naming
none gets) (tensorflow_serving/model_servers/http_rest_api_util.cc routes the label to
GetModelMetadataImpl, which sets the response's model_spec from the servable it resolved). The status API
(`/labels/<label>` without `/metadata`) ignores the label and lists every version, so it cannot answer this.
An answer is used for at most `max_age_s` (a label moves when TF Serving re-reads its config). A client request
does not wait for the asking where it can be helped: a background thread asks again, every half of `max_age_s`,
for each (model, label) counted since its last pass and for each routed model's `stable` (learned once the routing
loads, before its first request). A request asks itself only for a label never asked, or not counted for longer
than `max_age_s` (one thread asks, the others count with the answer it gets, or the last one while it asks).
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)

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
    """The version each (model, label) named when last asked. `version()` answers from it while the answer is younger
    than `max_age_s`; `refresh()` (a background thread, `start()`) asks again for the labels counted since its last
    pass and for `wanted()`, so that labels in use are asked off the request's path. Keys come only from calls that
    TF Serving answered and from `wanted()` (the routed models), so clients cannot grow the table."""

    def __init__(
        self,
        ask: Callable[[str, str], str | None],
        max_age_s: float = MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
        wanted: Callable[[], Iterable[tuple[str, str]]] = tuple,
    ):
        self.ask, self.max_age_s, self.clock, self.wanted = ask, max_age_s, clock, wanted
        self._known: dict[tuple[str, str], tuple[str | None, float]] = {}
        self._asking: dict[tuple[str, str], threading.Lock] = {}
        self._counted: set[tuple[str, str]] = set()  # keys read since the last refresh
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def version(self, model: str, label: str) -> str | None:
        """The version `label` names: the last answer while it is younger than max_age_s, else asked now; while one
        thread asks, the others get the last answer (None before the first: they wait for it)."""
        key = (model, label)
        with self._lock:
            known = self._known.get(key)
            asking = self._asking.setdefault(key, threading.Lock())
            self._counted.add(key)
        if known is not None and self.clock() - known[1] < self.max_age_s:
            return known[0]
        if not asking.acquire(blocking=known is None):
            return known[0]
        try:
            with self._lock:
                latest = self._known.get(key)
            if latest is not None and latest is not known:  # another thread asked while this one waited
                return latest[0]
            return self._ask(key)
        finally:
            asking.release()

    def refresh(self) -> None:
        """Ask again for every label counted since the last pass, and for the wanted ones; a label another thread
        is asking for is left to it."""
        with self._lock:
            keys, self._counted = self._counted | set(self.wanted()), set()
            locks = [(key, self._asking.setdefault(key, threading.Lock())) for key in sorted(keys)]
        for key, asking in locks:
            if asking.acquire(blocking=False):
                try:
                    self._ask(key)
                finally:
                    asking.release()

    def _ask(self, key: tuple[str, str]) -> str | None:
        version = self.ask(*key)
        with self._lock:
            self._known[key] = (version, self.clock())
        return version

    def start(self) -> None:
        """Refresh from a daemon thread every max_age_s / 2 until `stop()`."""

        def loop() -> None:
            while not self._stop.wait(self.max_age_s / 2):
                try:
                    self.refresh()
                except Exception:  # a failed pass must never end the refreshing
                    log.exception("proxy: asking TF Serving which versions the labels name failed")

        threading.Thread(target=loop, name="proxy-labels", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
