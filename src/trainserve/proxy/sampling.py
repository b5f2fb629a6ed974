"""What the proxy writes: a sampled share of Predict calls, each as a PredictionLog built on the writer's thread
from the bytes that crossed the proxy (the model, version and signature read from the response TF Serving sent)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from trainserve.proxy.wire import request_spec, response_spec
from trainserve.traffic.records import REQUEST_ID_HEADER, log_metadata, prediction_log, request_id
from trainserve.traffic.writer import TrafficWriter


class ProxyCapture:
    """Samples calls at `rate` (draws from `uniform`, a seeded source in tests) and offers them to `writer`."""

    def __init__(self, writer: TrafficWriter, rate: float, uniform: Callable[[], float] | None = None):
        self.writer, self.rate = writer, rate
        self.uniform = uniform or random.Random().random

    def own_call(self) -> None:
        """A call trainserve made itself (traffic.origin): never offered, counted apart (calls_skipped, origin)."""
        self.writer.skip()

    def sample(self) -> bool:
        return self.rate >= 1.0 or (self.rate > 0.0 and self.uniform() < self.rate)

    def log(self, request: bytes, response: bytes, metadata) -> None:
        """Offer one answered Predict; `metadata` is the client's (its x-request-id, when sent, is kept)."""
        given = next((value for key, value in metadata if key == REQUEST_ID_HEADER), None)
        when, rid, rate = time.time(), request_id(given if isinstance(given, str) else None), self.rate

        def record() -> bytes:
            spec = response_spec(response)  # the tensors are skipped, not decoded
            if not spec.name:  # a server that leaves the answer's model_spec empty: what was asked
                spec = request_spec(request)
            version = spec.version.value if spec.HasField("version") else None
            return prediction_log(
                log_metadata(spec.name, version, spec.signature_name, rate, rid, when), request, response
            )

        self.writer.submit(record)
