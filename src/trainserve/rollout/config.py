"""Options of `trainserve candidate`, `promote` and `rollback`, declared once (type, default, help); those of
`trainserve rollout`: trainserve.rollout.rollout_config.

Kept free of TensorFlow and gRPC so that `--help` and the refusals answer at once.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from trainserve.errors import TrainserveError
from trainserve.options import option, positive_int, share
from trainserve.rollout.plan import duration
from trainserve.rollout.targets import PROXY_JOB
from trainserve.tls import ClientTls

CONFIG_HELP = "the ModelServerConfig text proto serving polls (--model_config_file); rewritten atomically"
SERVER_HELP = "gRPC HOST:PORT of the server: wait until it serves the change (default: do not wait)"
WAIT_HELP = "seconds to wait for the server to apply the change (its config poll, a model load)"
ROUTING_HELP = (
    "the proxy's routing file (trainserve.routing/1): the model's route, which keeps requests naming no version on "
    "`stable` while a candidate is loaded, is removed once no `candidate` is labelled (default: no proxy routes)"
)
# What promote checks of a report, each refusal overridable by name (trainserve.rollout.checks says what each is).
CHECKS = ("gates", "bound", "baseline", "files", "evidence", "partial", "server", "replay")


def parse_checks(text: str) -> tuple[str, ...]:
    """`evidence,partial` -> ("evidence", "partial"); an unknown name names the known ones."""
    names = tuple(filter(None, (part.strip() for part in text.split(","))))
    unknown = [n for n in names if n not in CHECKS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: expected one or more of {', '.join(CHECKS)}")
    return names


def check_server(wait: float, tls: ClientTls) -> None:
    """How a step reaches the server, judged before the config file is touched."""
    if wait < 0:
        raise TrainserveError(f"--wait {wait}: expected >= 0")
    tls.check()


@dataclass
class StagingBudget:
    """How much loading a version may hurt `stable`'s callers (flags --stage-*, TRAINSERVE_STAGE_*), judged with
    --prometheus on the proxy's counts of stable's calls while it loads and warms up (trainserve.rollout.staging_watch).
    """

    max_slow_increase: float = option(
        0.05,
        "the share of stable's calls above its own p99 (before the load) while the version loads may exceed its "
        "share before by at most this; shown beyond it, the version is unloaded and refused",
        parse=share,
    )
    max_error_increase: float = option(
        0.01,
        "the share of stable's calls that fail (every status but OK and CANCELLED) while the version loads may "
        "exceed its share before by at most this; shown beyond it, the version is unloaded and refused",
        parse=share,
    )
    min_calls: int = option(
        100,
        "fewer calls of stable while the version loads cannot be judged (said and recorded; the version is staged), "
        "unless the damage is certain whatever the rest of them show",
        parse=positive_int,
    )
    baseline: float = option(
        300.0,
        "how long before the load stable's p99 and shares are read over (5m, 90s)",
        parse=duration,
        metavar="DURATION",
    )
    alpha: float = option(0.05, "each share's error rate (anytime-valid bounds, as the rollout's checks)", parse=share)

    def check(self) -> None:
        if not 0 < self.alpha < 1:
            raise TrainserveError(f"--stage-alpha {self.alpha:g}: expected a number in (0, 1)")


@dataclass
class CandidateConfig:
    """Serve the newest published version as `candidate`, without moving `stable`."""

    config: Path = option(Path("models.config"), CONFIG_HELP)
    model: str | None = option(None, "model in the config (default: its only model)")
    base_path: str | None = option(None, "create the config for --model with this base path if it does not exist")
    version: int | None = option(None, "stage this version (default: the newest on disk)", parse=positive_int)
    server: str = option("localhost:8500", "gRPC HOST:PORT of the server that loads the candidate")
    wait: float = option(600.0, WAIT_HELP)
    tls: ClientTls = option(factory=ClientTls)  # --tls-ca, --tls-cert, --tls-key, --tls-server-name
    skip_during_rollout: bool = option(
        False,
        "while a rollout of the model is in progress, stage nothing and exit 0 (logged), instead of refusing: a "
        "retried rollout Job resumes the version it was rolling out, never a newer one",
    )
    routing_file: Path | None = option(
        None,
        "the proxy's routing file (trainserve.routing/1): before the version loads, the model is routed with no "
        "share, so that requests naming no version (which TF Serving answers with its highest version) are answered "
        "by `stable`; promote and rollback remove that route once no `candidate` is labelled (default: not routed)",
    )
    prometheus: str | None = option(
        None,
        "Prometheus's URL: stable's calls through the proxy are watched while the version loads, and a load that "
        "hurts them beyond --stage-* is unloaded and refused; with --routing-file, the version loads only once every "
        "proxy replica reports the route (default: not watched; the route written, unconfirmed)",
    )
    proxy_job: str = option(PROXY_JOB, "the scrape job (Prometheus `job` label) of the proxy's replicas")
    stage: StagingBudget = option(factory=StagingBudget)

    def check(self) -> None:
        check_server(self.wait, self.tls)
        if self.base_path is not None and not self.model:
            raise TrainserveError("--base-path needs --model: the model the new config serves")
        if not self.server:
            raise TrainserveError("--server is empty: a candidate is labelled only once the server has loaded it")
        self.stage.check()
        if self.prometheus is not None:
            from trainserve.rollout.prometheus import check_url

            check_url(self.prometheus)


@dataclass
class PromoteConfig:
    """Move `stable` to the candidate that an evaluation report says passed."""

    config: Path = option(Path("models.config"), CONFIG_HELP)
    report: Path | None = option(None, "the eval report (trainserve eval --label candidate --report FILE)")
    replay: Path | None = option(
        None,
        "also a replay report of the candidate against stable on captured traffic (trainserve replay "
        "--max-flip-rate R --report FILE): its flip-rate and error-rate gates are re-derived from its counts",
    )
    override: tuple[str, ...] = option(
        (),
        f"CHECK[,CHECK]: promote although these checks refuse ({', '.join(CHECKS)}); needs --reason, and the "
        "history keeps both (a flag only: never read from the environment)",
        parse=parse_checks,
        env=False,
    )
    reason: str = option("", "why the --override, for the history", env=False)
    server: str | None = option(None, SERVER_HELP)
    wait: float = option(120.0, WAIT_HELP)
    tls: ClientTls = option(factory=ClientTls)
    routing_file: Path | None = option(None, ROUTING_HELP)

    def check(self) -> None:
        if self.report is None:
            raise TrainserveError("expected --report: the eval report of the candidate")
        if self.override and not self.reason.strip():
            raise TrainserveError(f"--override {','.join(self.override)}: expected --reason TEXT, kept in the history")
        check_server(self.wait, self.tls)


@dataclass
class RollbackConfig:
    """Move `stable` back to the previous stable version, which the config keeps loaded."""

    config: Path = option(Path("models.config"), CONFIG_HELP)
    model: str | None = option(None, "model in the config (default: its only model)")
    reason: str = option("", "why, for the history")
    server: str | None = option(None, SERVER_HELP)
    wait: float = option(120.0, WAIT_HELP)
    tls: ClientTls = option(factory=ClientTls)
    routing_file: Path | None = option(None, ROUTING_HELP)

    def check(self) -> None:
        check_server(self.wait, self.tls)
