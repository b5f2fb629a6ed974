"""`trainserve replay`'s options, declared once (the CLI is derived from them); free of gRPC and TensorFlow so
that `--help` answers at once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from trainserve.errors import TrainserveError
from trainserve.files import ensure_writable_dir
from trainserve.layout import DEFAULT_SIGNATURE
from trainserve.options import option, positive_int, share
from trainserve.shards import Shard, parse_shard
from trainserve.tls import ClientTls


@dataclass
class ReplayConfig:
    """Everything `trainserve replay` takes besides the capture paths; each field is the flag of the same name."""

    server: str = option("localhost:8500", "gRPC HOST:PORT of the server serving both versions")
    model: str = option("digits", "the model whose captured requests are replayed")
    label: str | None = option("candidate", "the version judged: the one behind this label")
    version: int | None = option(None, "the version judged, by number (instead of --label)", parse=positive_int)
    compare_with: str = option("stable", "VERSION|LABEL: the version it is judged against")
    signature: str | None = option(
        None, "replay only the requests that named this SignatureDef (default: the one the first request named)"
    )
    output: str | None = option(None, "the output compared (default: probabilities, else predictions)")
    task: Literal["auto", "classification", "regression"] = option(
        "auto", "what the output is (auto: probabilities -> classification, predictions -> regression)"
    )
    max_flip_rate: float | None = option(
        None,
        "exit 1 unless the flip rate's upper confidence bound is at most this share (e.g. 0.02)",
        parse=share,
    )
    max_error_rate: float = option(
        0.01,
        "exit 1 when either version failed more than this share of the requests replayed (those both refused as "
        "INVALID_ARGUMENT, a client's malformed request, not counted)",
        parse=share,
    )
    alpha: float = option(0.05, "the upper bound is one-sided at confidence 1 - alpha (Wilson score)")
    shard: Shard | None = option(
        None, "I/N: replay every N-th captured record from record I (then trainserve replay-merge)", parse=parse_shard
    )
    limit: int | None = option(None, "replay only the first N captured requests (of this shard)", parse=positive_int)
    concurrency: int = option(4, "request pairs in flight", parse=positive_int)
    retries: int = option(3, "retries of UNAVAILABLE/DEADLINE_EXCEEDED/RESOURCE_EXHAUSTED")
    unanswered: int = option(
        3,
        "stop (exit 2) after this many request pairs in a row that the server did not answer (both sides "
        "UNAVAILABLE or DEADLINE_EXCEEDED after the retries): it is gone",
        parse=positive_int,
    )
    timeout: float = option(10.0, "seconds per request attempt")
    wait: float = option(30.0, "seconds to wait for both versions to be AVAILABLE")
    tls: ClientTls = option(factory=ClientTls)
    report: Path | None = option(None, "write the JSON report here (and the HTML page beside it)")

    def check(self) -> None:
        """The flags judged before the capture is read or a request sent."""
        if self.version is not None:
            self.label = None
        if self.label is None and self.version is None:
            raise TrainserveError("neither --label nor --version: expected the version to judge")
        if not 0 < self.alpha < 0.5:
            raise TrainserveError(f"--alpha {self.alpha:g}: expected a level between 0 and 0.5")
        if self.timeout <= 0 or self.wait < 0 or self.retries < 0:
            raise TrainserveError("--timeout, --wait, --retries: expected timeout > 0, wait >= 0, retries >= 0")
        self.tls.check()
        if self.report is not None:
            ensure_writable_dir(self.report.parent, "--report")

    @property
    def judged(self) -> str:
        return str(self.version) if self.version is not None else str(self.label)

    def signature_of(self, first: str) -> str:
        """The signature replayed: --signature, else the one the first captured request named."""
        return self.signature or first or DEFAULT_SIGNATURE
