"""What the bake judges: the promoted version (`stable`, the rollout's candidate) against `previous` (the stable it
replaced, kept loaded), with the steps' anytime-valid bounds (trainserve.rollout.analysis) at --gate-alpha over
every look of the bake:

    bake_errors      stable's error share over the bake minus previous's on its own calls over the last step
                     before the promotion (the `baseline`: the same clients, the same route, the same counters)
    bake_slow_calls  the share of stable's calls above previous's p99 (the last step's threshold, kept) minus
                     previous's share above it over that step
    flip_rate        (a classifier) the shadow copies of stable's requests sent the other way, to previous, and
                     their answers compared with stable's: the shadow step's flip checks, the same budget

The baseline is the same traffic before the switch, not at the same time: a change that hits both versions alike
after it (an outage of a dependency, a load peak) would count against the new stable. So a failure against the
baseline stands once the copies to previous over the bake show stable beyond the budget of them too (their
failures, their calls above the same threshold), or while there are fewer than --gate-min-requests copies (shed,
or a plan without a shadow): previous answering the same requests as badly at the same time holds the rollback
back. Pairing on the copies is valid for that guard only: a copy exists only for a request stable answered (a
request stable failed is never copied, so previous's copies miss the requests' own faults) and it meets a lighter
load than the clients' calls (shed when the server is busy, timed without the proxy's work); both favour previous,
so the copies alone would fail an identical version, and as a guard they make a rollback no harder than a fair
comparison would. Limit: the copies weigh the time of an outage by the requests stable answered, so an outage
that begins during the bake, large enough (tens of percent) to weigh differently, can still show beyond the budget
and roll back; one there from the switch on cannot.
"""

from __future__ import annotations

from dataclasses import replace

from trainserve.rollout import analysis
from trainserve.rollout.analysis import ANSWERED, FAIL, Check
from trainserve.rollout.measure import step_counts
from trainserve.rollout.plan import SHADOW, Step
from trainserve.rollout.rollout_config import StepGate
from trainserve.stats.sequential import difference_sequence

BASELINE_SHARE = 0.5  # of a comparison's alpha, to the baseline: fixed counts, as wide as the bake's at first
COPY_CHECKS = ("shadow_errors", "slow_copies")  # the shadow step's checks of the copies' own version (previous)
THRESHOLD_KEYS = ("le", "lower", "weight")


def baseline_of(state: dict, step: int | None) -> dict:
    """The baseline from the last step's counting state (trainserve.rollout.measure): previous's calls on the
    stable route, its errors, its calls timed and above its p99, and that p99's threshold (None: none yet)."""
    limit = {k: state[k] for k in THRESHOLD_KEYS if k in state} if state.get("le") is not None else None
    counts = step_counts(state.get("counts") or {}, limit)
    return {
        "step": step,
        "requests": counts["stable_requests"],
        "errors": counts["stable_errors"],
        "timed": counts["stable_latency_count"],
        "slow": counts["stable_slow"],
        "threshold": limit,
    }


def bake_check_names(flips: bool) -> list[str]:
    """The bake's checks by name (`flips`: a classifier's copies to previous are compared), as the dry run says
    them."""
    shadow = analysis.check_names(Step(SHADOW, 100.0, 1.0), True) if flips else []
    return ["bake_errors", "bake_slow_calls", *(n for n in shadow if n not in COPY_CHECKS)]


def bake_checks(counts: dict, baseline: dict, gate: StepGate, offline: dict, flips: bool) -> list[Check]:
    """The bake's checks on its `counts` (measure's, with `candidate` = previous and `stable` = the new stable)."""
    found = [errors_check(counts, baseline, gate), slow_check(counts, baseline, gate)]
    if flips:
        shadow = analysis.checks(Step(SHADOW, 100.0, 1.0), True, counts, gate, offline)
        found += [c for c in shadow if c.name not in COPY_CHECKS]
    return found


def errors_check(counts: dict, baseline: dict, gate: StepGate) -> Check:
    errors, requests = counts["stable_errors"], counts["stable_requests"]
    before = (baseline["errors"], baseline["requests"])
    what = (
        f"error share {_share(errors, requests)} vs previous's {_share(*before)} before the switch"
        f" (step {_step(baseline)})"
    )
    found = _judged("bake_errors", what, (errors, requests), before, "calls", gate.max_error_increase, gate)
    copies = (counts["shadow_errors"], sum(counts[k] for k in ANSWERED))
    return _guarded(found, (errors, requests), copies, "failed copies to previous", gate.max_error_increase, gate)


def slow_check(counts: dict, baseline: dict, gate: StepGate) -> Check:
    slow, timed = counts["stable_slow"], counts["stable_latency_count"]
    before = (baseline["slow"], baseline["timed"])
    if baseline.get("threshold") is None:
        return Check("bake_slow_calls", analysis.UNKNOWN, "no p99 of previous's before the switch to judge against")
    what = f"calls above previous's p99 {_share(slow, timed)} vs previous's {_share(*before)} before the switch"
    found = _judged("bake_slow_calls", what, (slow, timed), before, "calls timed", gate.max_slow_increase, gate)
    copies = (counts["copies_slow"], counts["copies_latency_count"])
    return _guarded(found, (slow, timed), copies, "copies to previous above it", gate.max_slow_increase, gate)


def _judged(name: str, what: str, mine: tuple, before: tuple, unit: str, budget: float, gate: StepGate) -> Check:
    """analysis's verdict of stable's share minus the baseline's, at least --gate-min-requests of stable's calls
    before a pass, and a failure before them only if certain."""
    events, n = mine
    bounds = lambda seen: difference_sequence((events, seen), before, gate.alpha, 1 - BASELINE_SHARE)  # noqa: E731
    return analysis._judge(name, what, (n, f"stable {unit}"), budget, bounds, gate)


def _guarded(found: Check, mine: tuple, copies: tuple, words: str, budget: float, gate: StepGate) -> Check:
    """A failure stands once the copies to previous over the bake show it too, or while they are fewer than
    --gate-min-requests (shed, or no shadow: the baseline alone then); else it is held back (undecided): the same
    requests, at the same time, went about as badly on previous."""
    if found.result != FAIL or copies[1] < gate.min_requests:
        return found
    low, high = difference_sequence(mine, copies, gate.alpha, 1 - BASELINE_SHARE)
    if low > budget:
        return found
    said = (
        f"{found.said}, but held back: not beyond it against the {words} over the bake ({_share(*copies)}; bounds "
        f"[{low:+.4f}, {high:+.4f}]): a change that hits both versions alike"
    )
    return replace(found, result=analysis.UNKNOWN, said=said)


def _share(events: float, n: float) -> str:
    count = f"{events:.1f}" if events != int(events) else f"{int(events)}"
    return f"{count}/{int(n)} = {events / n:.4f}" if n else f"{count}/0"


def _step(baseline: dict) -> str:
    return str(baseline["step"] + 1) if baseline.get("step") is not None else "?"
