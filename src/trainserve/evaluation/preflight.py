"""What a comparison can show, said before it is run: the smallest accuracy margin its examples decide with 80 %
power, and the default margin applied when --max-drop names none, which is that margin.

A non-inferiority gate passes when the lower end of the two-sided 95 % interval of the accuracy change (a one-sided
2.5 % bound) lies above -margin. For two versions that are truly equal and disagree on a share psi of the n
examples (the discordance), the smallest margin they pass in 80 % of evals is computed exactly over the evals n
examples can draw (trainserve.stats.gate_power: the discordant pairs Binomial(n, psi), each won by either version
with probability 1/2), and shown rounded up to 4 decimals, so that a margin equal to the number shown keeps its
80 %. A margin below it is one the eval will mostly call "inconclusive", whatever the models do. With many pairs
it is the sizing rule read the other way: n = (z_0.975 + z_0.8)^2 psi / margin^2 examples decide a margin.

Before any request the discordance is unknown: it is assumed (--assume-discordance, default 0.03: about what
retrains of the demo's CNN with other seeds show on digits' held-out examples after 10 epochs, more than after
20); after the run the observed one is reported beside it, with the margin it decides and the power the applied
margin had at it (a discordance twice the assumed one passes equal versions in about half the evals, not 80 %).
Where that power falls below 80 % at a discordance above the assumed one, the report and the log say so as a
warning with what would decide: the rows the margin needs at that discordance, or a discordance known before the
comparison (stable's own with `previous`). The margin applied is never changed after the fact.

The default margin (`--max-drop` unset, or `auto`) is the smallest the examples decide at the assumed
discordance: as strict as the data can support, decided before any request. It is never looser than CEILING
(tiny eval sets, where the decidable margin would let real drops through) and never tighter than FLOOR (huge
ones, where retrains with another seed differ by more than the sampling noise: bench/promote_defaults.py and
docs/evidence.md measured both). Regression keeps a stated convention, 5 % of the baseline's MSE: a relative
margin whose size is itself estimated from the eval's data (the baseline's MSE), so its bound carries that
estimate's noise too.
"""

from __future__ import annotations

import logging
import math

from trainserve.errors import TrainserveError
from trainserve.margins import Margin
from trainserve.stats.gate_power import decidable_margin, pass_probability
from trainserve.stats.power import ALPHA, POWER, examples_to_decide

log = logging.getLogger(__name__)

# The default margin's bounds (bench/promote_defaults.py, docs/evidence.md). CEILING: a set too small to decide
# 4 points (under about 220 examples at 0.03) still gates on 4, and the pre-flight says it will mostly be
# inconclusive, rather than on a margin wide enough to let planted 5-point drops through. FLOOR: retrains of a
# 0.97-accurate model with other seeds differ by up to 0.27 points; on a huge set a tighter margin would refuse
# the training's own noise as a regression.
FLOOR, CEILING = 0.005, 0.04
AUTO = "auto"
REGRESSION_DEFAULT = Margin("mse", 5.0, relative=True, default=True)


def default_margin(n: int, discordance: float) -> Margin:
    """The accuracy margin eval gates on when --max-drop names none: the smallest `n` examples decide with 80 %
    power at `discordance`, kept within [FLOOR, CEILING]."""
    decidable = decidable_margin(n, discordance)
    return Margin("accuracy", min(max(decidable, FLOOR), CEILING), default=True)


def default_rule(n: int, discordance: float) -> dict:
    """How the default margin was chosen, for the log line and the report."""
    decidable, margin = decidable_margin(n, discordance), default_margin(n, discordance).drop
    bound = ": the ceiling" if margin < decidable else ": the floor" if margin > decidable else ""
    return {
        "margin": margin,
        "decidable": decidable if math.isfinite(decidable) else None,
        "floor": FLOOR,
        "ceiling": CEILING,
        "said": f"the smallest margin {n:,} examples decide with 80% power at the assumed discordance "
        f"{discordance:.3g} ({decidable:.4f}), kept within [{FLOOR:g}, {CEILING:g}]{bound}",
    }


def margins_for(
    max_drop: tuple[Margin, ...] | None, kind: str, n: int, discordance: float
) -> tuple[tuple[Margin, ...], bool]:
    """The margins a comparison of `n` examples gates on, and whether they are the default (--max-drop named
    none): the default rule's accuracy margin at the assumed `discordance`, or regression's convention."""
    if max_drop is not None:
        return max_drop, False
    return (default_margin(n, discordance) if kind == "classification" else REGRESSION_DEFAULT,), True


def preflight(
    margins: tuple[Margin, ...], n: int, discordance: float, require_power: bool, default: bool = False
) -> dict | None:
    """Before any request: each absolute accuracy margin against what n examples can decide at the assumed
    discordance. Logs one line for a margin below it (with --require-power: refuses, nothing sent); returns the
    planning numbers for the report, with how the default margin was chosen when it applies (None: no accuracy
    margin to plan for)."""
    accuracy = [m for m in margins if m.metric == "accuracy" and not m.relative]
    if not accuracy:
        return None
    smallest = decidable_margin(n, discordance)
    for margin in accuracy:
        if margin.drop >= smallest:
            continue
        said = (
            f"pre-flight: {n:,} examples at a discordance of {discordance:.3g} (assumed, --assume-discordance) "
            f"decide an accuracy margin of {smallest:.4f} or more with 80% power; --max-drop {margin.describe()} "
            f"is below it (equal versions pass it in {pass_probability(n, margin.drop, discordance):.0%} of evals), "
            f"so expect 'inconclusive' (about {examples_to_decide(margin.drop, discordance):,} examples would "
            f"decide {margin.drop:g})"
        )
        if require_power:
            raise TrainserveError(f"{said}: --require-power refuses; expected a larger margin or more examples")
        log.warning("%s", said)
    planned = _planning(n, discordance, "assumed", accuracy[0].drop)
    return planned | ({"default_margin": default_rule(n, discordance)} if default else {})


def _planning(n: int, discordance: float, source: str, margin: float) -> dict:
    """What n examples at this discordance decide, and how often equal versions pass the gate's `margin`."""
    return {
        "examples": n,
        "discordance": discordance,
        "discordance_source": source,
        "power": POWER,
        "one_sided_alpha": ALPHA,
        "smallest_margin": decidable_margin(n, discordance),
        "margin": margin,
        "power_at_margin": pass_probability(n, margin, discordance),
    }


def observed_power(planned: dict, comparison: dict) -> dict:
    """The pre-flight's numbers beside what the run observed: the discordance it found, the smallest margin that
    discordance decides with 80 % power, and the power the applied margin had at it (classification; regression
    has no discordance)."""
    said = {"assumed": planned}
    discordant = (comparison.get("test") or {}).get("discordant")
    if discordant:
        n = sum(discordant.values())
        share = (discordant["candidate_only"] + discordant["baseline_only"]) / n if n else 0.0
        said["observed"] = _planning(n, share, "observed", planned["margin"])
        warning = undecided_warning(planned, said["observed"])
        if warning:
            said["warning"] = warning
            log.warning("%s", warning)
    return said


def undecided_warning(assumed: dict, observed: dict) -> str | None:
    """Where the plan had its 80 % power at the assumed discordance but the versions disagreed more and left the
    margin below it (a margin already below it was the pre-flight's warning): the words that say the eval could
    not decide, and what would: more rows at the margin kept, or a discordance known before the comparison (never
    a margin loosened after seeing this one)."""
    if assumed["power_at_margin"] < POWER or observed["discordance"] <= assumed["discordance"]:
        return None
    if observed["power_at_margin"] >= POWER:
        return None
    margin, share = observed["margin"], observed["discordance"]
    needed = examples_to_decide(margin, share)
    return (
        f"warning: the versions disagree on {share:.3g} of {observed['examples']:,} rows, more than the "
        f"{assumed['discordance']:.3g} assumed: equal versions pass the margin {margin:g} in only "
        f"{observed['power_at_margin']:.0%} of evals at it, so 'inconclusive' or a failure says little; about "
        f"{needed:,} rows would decide {margin:g} at this discordance, or plan the next comparison on a discordance "
        "known before it (--assume-discordance: stable's own with `previous`), not on a margin loosened after "
        "seeing this one"
    )


def preflight_line(section: dict) -> str:
    """The summary's line: what the examples could decide, assumed before the run and observed after it, and
    what the observed discordance did to the power of the margin applied."""
    assumed, observed = section["assumed"], section.get("observed")
    said = (
        f"{assumed['examples']:,} examples decide an accuracy margin of {assumed['smallest_margin']:.4f} with "
        f"80% power at the assumed discordance {assumed['discordance']:.3g}"
    )
    if observed:
        said += (
            f"; at the observed {observed['discordance']:.3g}: {observed['smallest_margin']:.4f}, and equal versions "
            f"would pass the margin {observed['margin']:.4g} in {observed['power_at_margin']:.0%} of evals "
            f"({assumed['power_at_margin']:.0%} assumed)"
        )
    if section.get("warning"):
        said += f"; {section['warning']}"
    if assumed.get("default_margin"):
        said += f"; {default_line(assumed['default_margin'])}"
    return said


def default_line(rule: dict) -> str:
    """The log line and the summary's words for the default margin: its value and how it was chosen."""
    return f"default margin accuracy={rule['margin']:g}: {rule['said']}"
