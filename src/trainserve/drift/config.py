"""`trainserve drift`'s options, declared once (the CLI is derived from them)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainserve.errors import TrainserveError
from trainserve.files import ensure_writable_dir
from trainserve.options import option, positive_int
from trainserve.shards import Shard, parse_shard


@dataclass
class DriftConfig:
    """Everything `trainserve drift` takes besides the capture paths; each field is the flag of the same name."""

    model: str = option("digits", "the model whose captured inputs are compared")
    data_dir: Path = option(
        Path("data"), "where training wrote each version's record and data profile (DIR/<model>/versions/)"
    )
    max_psi: float = option(
        0.25,
        "a feature whose population stability index exceeds this plus its sampling-noise allowance (what undrifted "
        "samples of that size exceed 1 %% of the time) has drifted",
    )
    max_unseen_share: float = option(
        0.01,
        "a category feature whose share of values training never saw exceeds this plus its sampling-noise "
        "allowance has drifted",
    )
    shard: Shard | None = option(None, "I/N: count every N-th captured record from record I", parse=parse_shard)
    limit: int | None = option(None, "count only the first N captured requests (of this shard)", parse=positive_int)
    report: Path | None = option(None, "write the JSON report here (and the HTML page beside it)")

    def check(self) -> None:
        if self.max_psi <= 0 or not 0 <= self.max_unseen_share <= 1:
            raise TrainserveError("--max-psi, --max-unseen-share: expected a PSI > 0 and a share in [0, 1]")
        if not self.data_dir.is_dir():
            raise TrainserveError(f"--data-dir {self.data_dir}: no such directory: expected where training wrote")
        if self.report is not None:
            ensure_writable_dir(self.report.parent, "--report")
