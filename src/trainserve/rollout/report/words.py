"""The report's sentences: the verdict, in one sentence a person reads first, and each check at a look."""

from __future__ import annotations

from trainserve.rollout import analysis
from trainserve.rollout.analysis import Check
from trainserve.rollout.plan import PROMOTE, parse_plan
from trainserve.rollout.progress import BAKED
from trainserve.rollout.report.read import IN_PROGRESS, Account, Stint

RESULTS = {analysis.PASS: "passed", analysis.FAIL: "failed", analysis.UNKNOWN: "undecided"}


def numbered(check: Check) -> bool:
    """Whether the check's numbers are recorded (histories before them keep only its words)."""
    return None not in (check.low, check.high, check.budget)


def bounds(check: Check) -> str:
    return f"[{check.low:+.4f}, {check.high:+.4f}]" if numbered(check) else "n/a"


def budget(check: Check) -> str:
    return f"{check.budget:+.4f}" if numbered(check) else "n/a"


def units(check: Check) -> str:
    return f"{check.seen:,.0f} {check.unit}" if check.seen is not None and check.unit else "n/a"


def check_words(check: Check) -> str:
    """One check at one look: its bounds against its budget and what they rest on, else what it said."""
    if not numbered(check):
        return f"{check.name} {RESULTS.get(check.result, check.result)}: {check.said}"
    return (
        f"{check.name} {RESULTS.get(check.result, check.result)}: bounds {bounds(check)} against its budget "
        f"{budget(check)} after {units(check)}"
    )


def verdict(account: Account) -> str:
    """How the rollout ended, or stands, in one sentence."""
    who = f"version {account.candidate} of model {account.model}"
    outcome, last = account.outcome, account.last
    if outcome == "promoted":
        steps = [s.words() for s in parse_plan(account.start["plan"]).steps if s.kind != PROMOTE]
        baked = f" and its bake ended: {last.get('said')}" if last.get("event") == BAKED else ""
        return f"Promoted {who} to stable: every check passed at each step ({', '.join(steps)}){baked}."
    where = _where(account, last.get("step"))
    if outcome == "rolled back":
        return f"Rolled back {who}{where}: {_why_failed(account)}."
    if outcome == "rollback pending":
        return f"Rollback of {who} decided{where} and not finished (run the command again): {_why_failed(account)}."
    if outcome == "paused":
        why = _why_held(account, last.get("said") or "")
        held = f" after holding {last.get('held_seconds', 0):.0f} s"
        return f"Paused {who}{where}{held}, the route held on stable: {why}."
    assert outcome == IN_PROGRESS
    return f"The rollout of {who} is in progress{where}."


def _where(account: Account, step: int | None) -> str:
    stint = _last_stint(account)
    index = step if step is not None else stint.index if stint else None
    if index is None:
        return " before its first step"
    steps = parse_plan(account.start["plan"]).steps
    if stint is not None and stint.index == index and stint.words.startswith("bake"):
        return f" during the {stint.words} after its promotion"
    return f" at step {index + 1} ({steps[index].words()})" if index < len(steps) else ""


def _last_stint(account: Account) -> Stint | None:
    return account.stints[-1] if account.stints else None


def _why_failed(account: Account) -> str:
    """The failing checks of the last look when a look decided it, else the record's words (an abort, labels moved
    by hand, a report rewritten since the start)."""
    said = account.last.get("said") or ""
    stint = _last_stint(account)
    look = stint.looks[-1] if stint and stint.looks else None
    if look is not None and look.decision == analysis.ROLLBACK:
        failed = [check_words(c) for c in look.checks if c.result == analysis.FAIL]
        return "; ".join(failed) or said
    return said or "no reason recorded"


def _why_held(account: Account, said: str) -> str:
    """The checks that did not pass, in numbers, when the last look's holding is what paused the stint (its words
    are the pause's); else the pause's words (Prometheus unreachable, replicas that did not follow)."""
    stint = _last_stint(account)
    look = stint.looks[-1] if stint and stint.looks else None
    if look is None or look.decision != analysis.HOLD or said != _held_said(look):
        return said
    return "; ".join(
        [check_words(c) for c in look.checks if c.result != analysis.PASS] + ([look.unjudged] if look.unjudged else [])
    )


def _held_said(look) -> str:
    """What the controller says of a look that holds (trainserve.rollout.controller's `_watch`)."""
    return "; ".join([f"{c.name}: {c.said}" for c in look.checks] + ([look.unjudged] if look.unjudged else []))
