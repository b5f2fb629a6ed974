"""serve-local's request logging: `logging_config` in a ModelConfig of `--model_config_file`, TF Serving's own
LoggingConfig (config/logging_config.proto), honoured where tensorflow_model_server answers "No request-logger-creator
provided".

`sampling_config.sampling_rate` of a model's successful Predict calls (gRPC and REST) are written by a
trainserve.traffic.TrafficWriter under `log_collector_config.filename_prefix`, as PredictionLog records carrying the
version that answered, the signature, the rate, the time and the request id. A call is sampled before it is
logged and its record encoded on the writer's thread, so a request pays for a random number and a queue offer.
Models that name one prefix share its writer. A config reload applies the config's logging as TF Serving's does
(ServerCore::ReloadConfig updates its request logger): a prefix kept keeps its writer and files, a new one opens,
one no longer named is closed once its queue is written; each change is logged in one line.

Calls carrying `x-trainserve-origin` (traffic.origin: trainserve's own replay, eval and load) are not sampled; each
is counted as skipped (reason origin) on its model's writer, so a replay against a capturing server neither feeds
the capture it reads nor goes unseen.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainserve.errors import TrainserveError
from trainserve.traffic.accounting import ORIGIN
from trainserve.traffic.metrics import writer_lines
from trainserve.traffic.records import log_metadata, prediction_log, request_id
from trainserve.traffic.writer import TrafficWriter, WriterLimits

log = logging.getLogger(__name__)


def new_sampler() -> Callable[[], float]:
    """The uniform [0, 1) source sampling draws from (tests replace it with a seeded one)."""
    return random.Random().random


@dataclass(frozen=True)
class ModelCapture:
    """One model's logging: its rate and the writer of its prefix."""

    rate: float
    prefix: str
    writer: TrafficWriter


class Capture:
    """Which models log, and their writers; `sample` is called on every Predict."""

    def __init__(self, models: dict[str, ModelCapture], uniform: Callable[[], float]):
        self.models, self.uniform = models, uniform

    @classmethod
    def from_config(
        cls, config, limits: WriterLimits, config_path: str = "", running: Capture | None = None
    ) -> Capture | None:
        """The models whose logging_config asks for a rate above 0; None when none does. Bad settings fail
        here, before any model loads. `running`: the capture a reload replaces, whose writers of the prefixes
        still named are kept."""
        wanted = {}
        for model in config.model_config_list.config:
            if model.HasField("logging_config"):
                settings = _settings(model, config_path)
                if settings is not None:
                    wanted[model.name] = settings
        if not wanted:
            return None
        limits.check()
        kept = running.writers() if running is not None else {}
        writers = {p: kept.get(p) or TrafficWriter(p, limits) for p in sorted({p for _, p in wanted.values()})}
        models = {name: ModelCapture(rate, prefix, writers[prefix]) for name, (rate, prefix) in wanted.items()}
        return cls(models, new_sampler())

    def sample(self, name: str, origin: str | None = None) -> ModelCapture | None:
        """The model's logging when this call is sampled, else None; a call with an `origin` (trainserve's own)
        never is, and is counted as skipped."""
        target = self.models.get(name)
        if target is None:
            return None
        if origin is not None:
            target.writer.skip(ORIGIN)
            return None
        if target.rate < 1.0 and self.uniform() >= target.rate:
            return None
        return target

    @staticmethod
    def log(
        target: ModelCapture,
        model: tuple[str, int, str],
        to_bytes: Callable[[], tuple[bytes, bytes]],
        given_request_id: str | None,
    ) -> None:
        """Offer one answered call: `model` is (name, version that answered, signature); `to_bytes` gives the
        serialized request and response (called on the writer's thread)."""
        when, request = time.time(), request_id(given_request_id)

        def record() -> bytes:
            metadata = log_metadata(*model, target.rate, request, timestamp=when)
            return prediction_log(metadata, *to_bytes())

        target.writer.submit(record)

    def writers(self) -> dict[str, TrafficWriter]:
        """Each prefix's writer."""
        return {t.prefix: t.writer for t in self.models.values()}

    def close(self, keep: Capture | None = None) -> None:
        """Write what is queued and close (shutdown, after the last request), except the writers `keep` took
        over (a reload): all within one drain_seconds (the writers' limits), each counting what it could not
        write as lost."""
        kept = {id(w) for w in keep.writers().values()} if keep is not None else set()
        closing = [w for w in self.writers().values() if id(w) not in kept]
        deadline = time.monotonic() + max((w.limits.drain_seconds for w in closing), default=0.0)
        for writer in closing:
            writer.close(max(0.0, deadline - time.monotonic()))

    def describe(self) -> dict[str, tuple[float, str]]:
        """Each capturing model's (rate, filename_prefix)."""
        return {name: (t.rate, t.prefix) for name, t in sorted(self.models.items())}

    def prometheus_lines(self) -> list[str]:
        return writer_lines(self.writers())


def log_change(before: Capture | None, after: Capture | None) -> None:
    """One line when a start or a config reload changes what is captured (turned on, changed, or off)."""
    was = before.describe() if before is not None else {}
    now = after.describe() if after is not None else {}
    if was == now:
        return
    if not now:
        log.info("capture off: no model's logging_config asks for a rate above 0")
        return
    said = ", ".join(f"{name} {rate:g} of Predict calls to {prefix}" for name, (rate, prefix) in now.items())
    log.info("capture %s: %s", "on" if not was else "changed", said)


def _settings(model, config_path: str) -> tuple[float, str] | None:
    """(rate, filename_prefix) of a model's logging_config, or None when its rate is 0 (nothing logged)."""
    where = f"model config file {config_path}: model {model.name!r} logging_config"
    rate = model.logging_config.sampling_config.sampling_rate
    prefix = model.logging_config.log_collector_config.filename_prefix
    if not 0.0 <= rate <= 1.0:
        raise TrainserveError(f"{where}: sampling_rate {rate}: expected a share between 0 and 1")
    if rate == 0.0:
        return None
    if not prefix or prefix.endswith("/") or Path(prefix).name in ("", ".", ".."):
        raise TrainserveError(
            f"{where}: log_collector_config.filename_prefix {prefix!r}: expected a path prefix for the capture "
            "files (e.g. /captures/digits)"
        )
    return rate, prefix
