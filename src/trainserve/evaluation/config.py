"""`trainserve eval`'s options, declared once: type, default and help. The CLI is derived from them.

Kept free of TensorFlow and gRPC so that `trainserve eval --help` answers at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainserve.data import SyntheticSpec
from trainserve.errors import TrainserveError
from trainserve.layout import DEFAULT_SIGNATURE
from trainserve.options import option, positive_int


@dataclass
class EvalConfig:
    """Everything `trainserve eval` takes; each field is the flag of the same name."""

    server: str = option("localhost:8500", "gRPC HOST:PORT")
    model: str = option("digits", "model name")
    version: int | None = option(None, "evaluate this version (default: newest)", parse=positive_int)
    label: str | None = option(None, "evaluate the version behind this label")
    signature: str = option(DEFAULT_SIGNATURE, "SignatureDef to call")
    data: str = option("digits", "digits | synthetic | FILE.npz with x_test, y_test")
    batch_size: int = option(256, "examples per request", parse=positive_int)
    concurrency: int = option(4, "requests in flight", parse=positive_int)
    timeout: float = option(10.0, "seconds per request attempt")
    retries: int = option(5, "retries of UNAVAILABLE/DEADLINE_EXCEEDED/RESOURCE_EXHAUSTED")
    wait: float = option(60.0, "seconds to wait for the model to be AVAILABLE")
    limit: int | None = option(None, "evaluate only the first N examples", parse=positive_int)
    top_k: int = option(5, "k of the top-k accuracy", parse=positive_int)
    report: Path | None = option(None, "write the JSON report here")
    plots: Path | None = option(None, "write confusion_matrix.png and latency_histogram.png here")
    min_accuracy: float | None = option(None, "exit 1 when accuracy is below this")
    tls_ca: Path | None = option(None, "PEM root certificate for a TLS server")
    compare_local: Path | None = option(None, "also run this SavedModel version dir in-process on CPU")
    synthetic: SyntheticSpec = option(factory=SyntheticSpec)

    def check(self) -> None:
        if self.version is not None and self.label:
            raise TrainserveError("--version and --label both given: expected at most one")
        for name in ("batch_size", "concurrency"):
            if getattr(self, name) < 1:
                raise TrainserveError(f"--{name.replace('_', '-')} {getattr(self, name)}: expected >= 1")
        if self.timeout <= 0 or self.retries < 0 or self.wait < 0:
            raise TrainserveError("--timeout must be > 0, --retries and --wait >= 0")
        if self.compare_local is not None and not (self.compare_local / "saved_model.pb").is_file():
            raise TrainserveError(f"--compare-local {self.compare_local}: expected a SavedModel version directory")
