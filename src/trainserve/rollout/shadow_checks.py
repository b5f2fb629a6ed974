"""The shadow's verdicts beyond the overall flip rate (trainserve.rollout.analysis runs them):

    flip_classes  each of stable's classes (the proxy's flip matrix rows: 16 class ids and `other`) flips within
                  --gate-flip-class-slack times the overall flip budget; each class bounded at --gate-alpha / 17,
                  so that the chance any class ever fails a candidate within its budget, over every class and look
                  of the step, is at most --gate-alpha (Bonferroni over the proxy's fixed labels, each class's
                  bound anytime-valid). A guard: it fails a candidate shown beyond a class's budget, and otherwise
                  passes, so a good candidate never waits for its rare classes (flip_rate decides when it passes)
    differences   regression: the share of examples compared whose answer differs from stable's by more than the
                  tolerance (--gate-shadow-tolerance times stable's mean absolute error on the eval report's split,
                  carried to the proxy by the routing file) against a budget anchored on the share replay showed
                  beyond the same tolerance, as the flip budget is on the offline disagreement. A share of examples,
                  not a mean difference: one huge difference moves it by one example, so heavy tails do not
                  widen its bounds

The per-class budget cannot come from the eval report: its discordant pairs per class are by the true class, the
live rows by stable's predicted class; so it is the overall budget with a stated slack.
"""

from __future__ import annotations

from dataclasses import replace

from trainserve.proxy.shadow_compare import CLASS_LABELS
from trainserve.rollout.judging import FAIL, PASS, UNKNOWN, Check, judge, one, share
from trainserve.rollout.rollout_config import StepGate
from trainserve.stats.proportions import wilson_upper

CLASS_FAMILY = CLASS_LABELS + 1  # the labels a class can have on the proxy's page: the split of alpha
PAIRS, FLIPS = "shadow_class_pairs:", "shadow_class_flips:"


def anchored_budget(found: dict | None, gate: StepGate) -> tuple[float, str] | None:
    """A live rate's budget from an offline count and why: the larger of --gate-flip-budget-multiple times the
    offline rate and its one-sided Wilson bound at --gate-alpha (a small offline sample cannot make the budget
    small), at least --gate-flip-budget-floor. None without an offline count."""
    if not found or not found["examples"]:
        return None
    count, examples = found["count"], found["examples"]
    rate, upper = count / examples, wilson_upper(count, examples, gate.alpha)
    budget = max(gate.flip_budget_floor, gate.flip_budget_multiple * rate, upper)
    said = (
        f"budget {budget:.4f} = max(floor {gate.flip_budget_floor:g}, {gate.flip_budget_multiple:g} x {rate:.4f}, "
        f"bound {upper:.4f}) from {found['source']}'s {found.get('what', 'disagreement')} {count}/{examples}"
    )
    return budget, said


def class_counts(counts: dict) -> dict[str, tuple[int, int]]:
    """Stable's class label -> (flips, classified pairs) this step, from measure's `shadow_class_*:<class>`."""
    return {
        key[len(PAIRS) :]: (counts.get(FLIPS + key[len(PAIRS) :], 0), n)
        for key, n in counts.items()
        if key.startswith(PAIRS) and n > 0
    }


def flip_classes(counts: dict, gate: StepGate, offline: dict) -> Check:
    name = "flip_classes"
    overall = anchored_budget(offline.get("disagreement"), gate)
    if overall is None:
        return Check(name, UNKNOWN, "no offline disagreement of the two versions (START record) to anchor a budget")
    budget = min(1.0, gate.flip_class_slack * overall[0])
    rows = class_counts(counts)
    judged = {
        label: judge(
            name,
            f"class {label}: flips {share(*seen)}",
            (seen[1], "pairs"),
            budget,
            one(seen[0], gate.alpha / CLASS_FAMILY),
            _class_gate(gate, seen[1], sum(n for _, n in rows.values())),
        )
        for label, seen in sorted(rows.items())
    }
    about = f"budget {budget:.4f} = {gate.flip_class_slack:g} x the overall {overall[0]:.4f}, alpha/{CLASS_FAMILY}"
    failed = [c for c in judged.values() if c.result == FAIL]
    if failed:
        worst = max(failed, key=lambda c: c.low)
        return Check(
            name, FAIL, f"{worst.said} ({about}; {len(failed)} of {len(rows)} classes beyond)", **_numbers(worst)
        )
    if not judged:
        return Check(name, PASS, f"no classified pair by class yet ({about}; only a failure counts here)")
    top = max(judged.values(), key=lambda c: c.high)
    return Check(
        name,
        PASS,
        f"highest bound {top.said} ({about}; {len(rows)} classes; only a failure counts here: flip_rate passes)",
        **_numbers(top),
    )


def _class_gate(gate: StepGate, pairs: int, total: int) -> StepGate:
    """A class's gate: its share of alpha, and --gate-min-requests counted over every class's pairs, not its own
    (a class of 3 % would need 200 of its own, 6,700 pairs in all, before it could fail): until the step has that
    many, a class fails only if it would with the rest of them all its own and unflipped."""
    return replace(gate, alpha=gate.alpha / CLASS_FAMILY, min_requests=pairs + max(0, gate.min_requests - total))


def _numbers(found: Check) -> dict:
    return {"low": found.low, "high": found.high, "budget": found.budget, "seen": found.seen, "unit": found.unit}


def differences(counts: dict, gate: StepGate, offline: dict) -> Check:
    name = "differences"
    anchor = offline.get("difference")
    budget = anchored_budget(anchor, gate)
    if budget is None:
        return Check(name, UNKNOWN, "no offline share beyond a tolerance (START record) to anchor a budget")
    beyond, tolerated = counts.get("shadow_beyond", 0), counts.get("shadow_tolerated", 0)
    if not tolerated and counts.get("shadow_pairs", 0):
        return Check(
            name,
            UNKNOWN,
            f"{counts['shadow_pairs']} pairs compared, none against the routing file's shadow_tolerance: expected a "
            "proxy that counts shadow_beyond_tolerance",
        )
    what = f"differs beyond {anchor['tolerance']:.4g} {share(beyond, tolerated)} of examples ({budget[1]})"
    return judge(name, what, (tolerated, "examples compared"), budget[0], one(beyond, gate.alpha), gate)
