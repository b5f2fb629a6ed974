"""Options of `trainserve rollout`, declared once (type, default, help): the plan and its bounds, what each step
must show (StepGate), how the controller looks, tells and waits.

Kept free of TensorFlow and gRPC so that `--help` and the refusals answer at once.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from trainserve.errors import TrainserveError
from trainserve.options import option, positive_int, share
from trainserve.rollout.config import CONFIG_HELP, SERVER_HELP, check_server
from trainserve.rollout.notify_sender import Receiver, parse_receivers
from trainserve.rollout.plan import AUTO, CANARY, EXAMPLE_PLAN, PROMOTE, Plan, duration, parse_plan, plan_or_auto
from trainserve.rollout.targets import PROXY_JOB
from trainserve.tls import ClientTls


def _multiple(text: str) -> float:
    value = float(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: expected a multiple >= 1 (1: the offline rate itself)")
    return value


def _alpha(text: str) -> float:
    value = float(text)
    if not 0 < value < 0.5:
        raise argparse.ArgumentTypeError(f"{value}: expected a level between 0 and 0.5, such as 0.05")
    return value


@dataclass
class StepGate:
    """What each step of `trainserve rollout` must show before it advances (flags --gate-*, TRAINSERVE_GATE_*).

    Each check bounds its quantity with anytime-valid bounds at --gate-alpha (trainserve.stats.sequential): it
    fails when the step's counts show the quantity above its budget, passes when they show it within, and
    otherwise knows nothing yet (at the step's end the step holds)."""

    max_error_increase: float = option(
        0.01,
        "errors (every status but OK and CANCELLED): the candidate's share of its canary requests may exceed "
        "stable's share of its own requests over the same step by at most this; so may the share of its shadow "
        "copies that fail (a copy is a second call to the same server: it meets the transient errors stable's "
        "calls meet)",
        parse=share,
    )
    max_relative_error_increase: float = option(
        0.1,
        "errors: where larger, the budget of both error checks is this share of stable's own error share over the "
        "step instead (0.1: +3 points at stable's 30 %%), so that an outage failing both versions alike is judged "
        "on what the candidate adds to it; 0 keeps the budget in points at any error share",
        parse=share,
    )
    max_slow_increase: float = option(
        0.01,
        "latency: the share of the candidate's calls slower than stable's p99 (as histogram_quantile() places it "
        "when the step begins) may exceed stable's own share above it by at most this",
        parse=share,
    )
    flip_budget_floor: float = option(
        0.01,
        "flips: the online flip rate's budget is at least this, whatever the offline evidence shows",
        parse=share,
    )
    flip_budget_multiple: float = option(
        2.0,
        "flips: the budget is the larger of this times the two versions' offline disagreement (replay's flip "
        "rate, else eval's discordant share) and that disagreement's upper bound, at least the floor",
        parse=_multiple,
    )
    max_shadow_dropped: float = option(
        0.5,
        "flips: the check holds while the shadow copies dropped or shed exceed this share of those offered (the "
        "flips of the rest may not stand for the traffic), unless the flips compared fail it even with every unsent "
        "copy counted as flipping nothing. Above what the proxy's default --shadow-shed-latency-margin sheds on a "
        "busy server (a quarter to two fifths on two saturated cores, docs/progressive-delivery.md)",
        parse=share,
    )
    min_requests: int = option(
        200,
        "no check passes on fewer than this many of its own units (canary requests, timed calls, classified shadow "
        "pairs, answered copies), nor fails unless its failure is certain whatever the rest of them show",
        parse=positive_int,
    )
    alpha: float = option(
        0.05,
        "each check's error rate over all the looks of a step (anytime-valid): the chance it ever fails a "
        "candidate within its budget, or ever passes one beyond it",
        parse=_alpha,
    )


def _step_name(text: str) -> str:
    """A step as --approve-before names it: a number (1-based), a share (25%) or `canary` (the first canary step);
    matched to the plan later."""
    if not re.fullmatch(rf"[1-9]\d*|\d+(\.\d+)?%|{CANARY}", text.strip()):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected a step number (1 for the first), a share such as 25%, or `canary` (the first canary "
            "step)"
        )
    return text.strip()


def step_index(plan: Plan, name: str) -> int:
    """The index of the step --approve-before names: its number (1-based) or the share of a canary step or of the
    promotion (`100%`); else a one-line error naming the plan's steps."""
    shares = {f"{s.percent:g}%": i for i, s in enumerate(plan.steps) if s.kind in (CANARY, PROMOTE)}
    if name.isdigit() and 1 <= int(name) <= len(plan.steps):
        return int(name) - 1
    if name == CANARY:
        return next(i for i, s in enumerate(plan.steps) if s.kind in (CANARY, PROMOTE))
    if name.endswith("%") and f"{float(name[:-1]):g}%" in shares:
        return shares[f"{float(name[:-1]):g}%"]
    raise TrainserveError(
        f"--approve-before {name}: expected a step of the plan {plan.text()!r}: its number (1 to {len(plan.steps)}) "
        f"or its share ({', '.join(shares)})"
    )


def _seconds(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value}: expected seconds > 0")
    return value


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number above 0")
    return value


def _duration(text: str) -> float:
    """Seconds (`1800`) or a duration with a unit (`30m`)."""
    try:
        return _seconds(text)
    except ValueError:
        return duration(text)


def _bake(text: str) -> float | str:
    """--bake: `auto`, 0 (no bake), or seconds or a duration with a unit."""
    if text.strip() == AUTO:
        return AUTO
    if text.strip() in ("0", "0s", "0m", "0h"):
        return 0.0
    try:
        return _duration(text)
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"{text!r}: expected `auto`, 0 (no bake), or a duration such as 30m") from None


@dataclass
class RolloutConfig:
    """Move a candidate through a step plan on live traffic (shadow, canary shares) with the proxy's routing
    file, judged between steps on Prometheus, then promote it, or roll it back."""

    config: Path = option(Path("models.config"), CONFIG_HELP)
    model: str | None = option(None, "model in the config (default: its only model)")
    candidate: int | None = option(
        None,
        "the version to roll out, labelled `candidate` if it is not yet (default: the config's `candidate`)",
        parse=positive_int,
    )
    routing_file: Path | None = option(None, "the proxy's routing file (trainserve.routing/1), rewritten atomically")
    plan: Plan | str = option(
        AUTO,
        "`auto`: steps sized to the model's request rate (read from Prometheus) to decide within --max-duration; or "
        f"steps: `shadow [P%%] DURATION`, then `P%% DURATION` canary shares, each optionally followed by `hold "
        f"DURATION`, ending with `100%%` (promote), as in {EXAMPLE_PLAN.replace('%', '%%')!r}",
        parse=plan_or_auto,
    )
    target_duration: float = option(
        1800.0,
        "plan auto: the smallest canary share whose plan takes at most this (seconds, or 30m) at the median, else "
        "the quickest one that fits --max-duration",
        parse=_duration,
    )
    max_duration: float = option(
        8 * 3600.0,
        "plan auto: the longest a plan may take without pausing (every step's duration and hold; seconds, or 8h: "
        "a rollout begun in the evening decides by the morning): a "
        "plan that cannot decide within it at the measured rate is refused before anything moves",
        parse=_duration,
    )
    max_exposure: float = option(
        1000.0,
        "plan auto: the most canary requests answered before the first look (what a candidate failing every call "
        "costs before the controller can see it): bounds the canary's share",
        parse=_positive,
    )
    expected_rate: float | None = option(
        None,
        "plan auto: size for this many requests per second (default: the model's rate through the proxy, read from "
        "Prometheus)",
        parse=_positive,
    )
    rate_history: str = option(
        "7d",
        "plan auto: the rate is the slowest hour, at the hours of the day the plan spans, over this much of "
        "Prometheus's history (a PromQL duration; empty: the last hour's rate)",
    )
    prometheus: str | None = option(
        None, "Prometheus's URL, asked the proxy's series and recording rules between steps"
    )
    proxy_job: str = option(
        PROXY_JOB,
        "the scrape job (Prometheus `job` label) of the proxy's replicas, whose series are read; refused while a "
        "replica under another job routes the model (its calls would be neither judged nor waited for)",
    )
    report: Path | None = option(
        None, "the candidate's eval report, checked as promote checks it, before anything moves"
    )
    replay: Path | None = option(None, "also its replay report against stable (as promote --replay)")
    gate: StepGate = option(factory=StepGate)
    bake: float | str = option(
        AUTO,
        "after the promotion, keep `previous` loaded this long (seconds, or 30m) and keep judging the new stable "
        "against it (errors and slow calls against previous's before the switch, answers against previous's on "
        "shadow copies), rolling back to previous on a failure; `auto`: long enough that a version twice as slow "
        "is rolled back within it at the measured rate (15m to 2h; 30m where the rate is not known); 0: no bake",
        parse=_bake,
        metavar="DURATION",
    )
    interval: float = option(30.0, "seconds between two looks at Prometheus", parse=_seconds)
    max_hold: float = option(
        1800.0,
        "seconds a step may stay inconclusive (too few requests, Prometheus unreachable) before the controller stops "
        "with the rollout paused where it is (run it again to resume)",
        parse=_seconds,
    )
    approve_before: str | None = option(
        None,
        "before entering this step (its number, 1 for the first, its share: 25%%, or 100%% for the promotion, "
        "or `canary`: the first canary step, whatever share the plan `auto` chose), hold the route with no canary "
        "share (a shadow goes on) and wait, never pausing, until "
        "`trainserve rollout --approve --reason TEXT`; an approval given earlier counts",
        parse=_step_name,
        metavar="STEP",
    )
    notify: tuple[Receiver, ...] | None = option(
        None,
        "POST a JSON document to each URL at every decision (started, step, held past half of --max-hold, "
        "awaiting-approval, approved, paused, rolled-back, promoted), from a background thread: a receiver that is "
        "down never delays a decision; alertmanager+URL or generic+URL sets one receiver's format",
        parse=parse_receivers,
        metavar="URL[,URL]",
    )
    notify_format: Literal["generic", "alertmanager"] = option(
        "generic",
        "the receivers' format: generic (trainserve.notification/1) or alertmanager (its webhook body, version 4)",
    )
    notify_link: str | None = option(
        None,
        "URL under which the rollout's report pages are served, for the notifications' links (default: a path)",
        metavar="URL",
    )
    sticky_header: str | None = option(None, "request header by whose value one caller always sees one version")
    sticky_salt: str | None = option(
        None,
        "salt of the sticky hash, kept in the START record (default: derived from the model and the candidate, so "
        "that each rollout's canary is another set of callers)",
    )
    dry_run: bool = option(False, "print the plan, the routing of each step and the queries; change nothing")
    abort: bool = option(False, "roll back the rollout in progress now (needs --reason)", env=False)
    approve: bool = option(
        False,
        "approve the rollout in progress to enter its --approve-before step (needs --reason; recorded with who ran "
        "it); the waiting controller goes on at its next look",
        env=False,
    )
    reason: str = option("", "why --abort or --approve, for the history", env=False)
    server: str | None = option(None, SERVER_HELP)
    wait: float = option(
        120.0,
        "seconds to wait for the server to apply a change (a load, an unload) and for every proxy replica to report "
        "a routing change on Prometheus (a rollback drops `candidate` only then; past it, it stops pending)",
    )
    tls: ClientTls = option(factory=ClientTls)

    def __post_init__(self):
        if isinstance(self.bake, str) and self.bake != AUTO:
            try:
                self.bake = _bake(self.bake)
            except argparse.ArgumentTypeError as exc:
                raise TrainserveError(f"--bake {exc}") from None
        if isinstance(self.plan, str) and self.plan != AUTO:
            try:
                self.plan = parse_plan(self.plan)
            except argparse.ArgumentTypeError as exc:
                raise TrainserveError(f"--plan {exc}") from None

    def check(self) -> None:
        check_server(self.wait, self.tls)
        if self.approve:  # a person's word in the history: no routing, no Prometheus needed
            if self.abort:
                raise TrainserveError("--approve with --abort: expected one of them")
            if not self.reason.strip():
                raise TrainserveError("--approve: expected --reason TEXT, kept in the history")
            return
        if self.routing_file is None:
            raise TrainserveError("expected --routing-file: the routing file the proxy polls")
        if self.abort:
            if not self.reason.strip():
                raise TrainserveError("--abort: expected --reason TEXT, kept in the history")
            return
        if self.approve_before is not None and self.plan != AUTO:  # `auto`: once sized, before anything moves
            step_index(self.plan, self.approve_before)
        if self.report is None:
            raise TrainserveError("expected --report: the candidate's eval report, checked as promote checks it")
        if self.prometheus is None and not self.dry_run:
            raise TrainserveError("expected --prometheus URL: the Prometheus that scrapes the proxy")
        if self.rate_history and not re.fullmatch(r"[1-9]\d*[smhdwy]", self.rate_history):
            raise TrainserveError(f"--rate-history {self.rate_history!r}: expected a PromQL duration such as 7d, or ''")
        if self.prometheus is not None:
            from trainserve.rollout.prometheus import check_url

            check_url(self.prometheus)
