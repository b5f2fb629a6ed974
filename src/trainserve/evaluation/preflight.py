"""What a comparison can show, said before it is run: the smallest accuracy margin its examples decide with 80 %
power, and the default margin applied when --max-drop names none.

A non-inferiority gate passes when the lower end of the two-sided 95 % interval of the accuracy change (a one-sided
2.5 % bound) lies above -margin. For two versions that are truly equal and disagree on a share psi of the n
examples (the discordance), that end lies within about (z_0.975 + z_0.8) sqrt(psi / n) of 0 in 80 % of evals,
and never closer to 0 than the interval with no discordant pair at all (which still has a width). A margin below
it is one the eval will mostly call "inconclusive", whatever the models do. The sizing rule read the other way:
n = (z_0.975 + z_0.8)^2 psi / margin^2 examples decide a margin with 80 % power.

Before any request the discordance is unknown: it is assumed (--assume-discordance, default 0.03: about what
retrains of the demo's CNN with other seeds show on digits' held-out examples after 10 epochs, more than after
20) and the observed one is reported after the run, with the margin it decides.
"""

from __future__ import annotations

import logging
import math
from fractions import Fraction

from trainserve.errors import TrainserveError
from trainserve.evaluation.noninferiority import Margin
from trainserve.stats.power import ALPHA, POWER, examples_to_decide, smallest_decidable_margin
from trainserve.stats.proportions import paired_proportion_interval

log = logging.getLogger(__name__)

# The margin eval gates on when --max-drop names none (and make promote, compose and the k8s promote Job by
# default): on the demo's 355 held-out examples a retrain with another seed passes it in 10 of 10 seeds (15 or 20
# epochs) and a planted 5-point drop in 0 of 10 (bench/promote_defaults.py, docs/evidence.md). Regression
# has no such measurement: 5 % of stable's MSE, a stated convention.
DEFAULT_MARGINS = {
    "classification": Margin("accuracy", 0.04, default=True),
    "regression": Margin("mse", 5.0, relative=True, default=True),
}


def decidable_margin(n: int, discordance: float, power: float = POWER) -> float:
    """The smallest accuracy margin n paired examples with this discordance decide (non-inferior) with `power`
    when the versions are truly equal. With the expected number of discordant pairs D = n * discordance, each
    falls to either version with probability 1/2: the gate's own interval (trainserve.stats.proportions) at the
    split of D that `power` of evals reach or beat gives the margin, so the answer carries the interval's width
    at few discordant pairs (with none it is the interval of 0 of n, never 0). Beyond _EXACT_PAIRS discordant
    pairs the normal planning number (trainserve.stats.power) is within about 1 % of it."""
    if n <= 0:
        return math.inf
    pairs = round(n * max(discordance, 0.0))
    if pairs > _EXACT_PAIRS:
        return smallest_decidable_margin(n, discordance, power=power) or math.inf
    wins = _wins_reached(pairs, power)
    return -paired_proportion_interval(wins, pairs - wins, n, 1 - 2 * ALPHA)[0]


_EXACT_PAIRS = 2000


def _wins_reached(pairs: int, power: float) -> int:
    """The most candidate-only examples among `pairs` discordant ones that at least `power` of equal-version evals
    reach (Binomial(pairs, 1/2), in exact integers)."""
    share = Fraction(power).limit_denominator(10**6)
    total, reached = 2**pairs, 0
    for wins in range(pairs, -1, -1):
        reached += math.comb(pairs, wins)
        if reached * share.denominator >= share.numerator * total:
            return wins
    return 0


def margins_for(max_drop: tuple[Margin, ...] | None, kind: str) -> tuple[tuple[Margin, ...], bool]:
    """The margins a comparison gates on, and whether they are the default (--max-drop named none)."""
    if max_drop is not None:
        return max_drop, False
    return (DEFAULT_MARGINS[kind],), True


def preflight(
    margins: tuple[Margin, ...], n: int, discordance: float, assumed: bool, require_power: bool
) -> dict | None:
    """Before any request: each absolute accuracy margin against what n examples can decide. Logs one line for
    a margin below it (with --require-power: refuses, nothing sent); returns the planning numbers for the report
    (None: no accuracy margin to plan for)."""
    accuracy = [m for m in margins if m.metric == "accuracy" and not m.relative]
    if not accuracy:
        return None
    smallest = decidable_margin(n, discordance)
    how = "assumed, --assume-discordance" if assumed else "observed"
    for margin in accuracy:
        if margin.drop >= smallest:
            continue
        said = (
            f"pre-flight: {n:,} examples at a discordance of {discordance:.3g} ({how}) decide an accuracy margin of "
            f"{smallest:.4f} or more with 80% power; --max-drop {margin.describe()} is below it, so expect "
            f"'inconclusive' (about {examples_to_decide(margin.drop, discordance):,} examples would decide "
            f"{margin.drop:g})"
        )
        if require_power:
            raise TrainserveError(f"{said}: --require-power refuses; expected a larger margin or more examples")
        log.warning("%s", said)
    return _planning(n, discordance, "assumed" if assumed else "observed", smallest)


def _planning(n: int, discordance: float, source: str, smallest: float) -> dict:
    return {
        "examples": n,
        "discordance": discordance,
        "discordance_source": source,
        "power": POWER,
        "one_sided_alpha": ALPHA,
        "smallest_margin": smallest,
    }


def observed_power(planned: dict, comparison: dict) -> dict:
    """The pre-flight's numbers beside what the run observed: the discordance it found and the smallest margin
    that discordance decides with 80 % power (classification; regression has no discordance)."""
    said = {"assumed": planned}
    discordant = (comparison.get("test") or {}).get("discordant")
    if discordant:
        n = sum(discordant.values())
        share = (discordant["candidate_only"] + discordant["baseline_only"]) / n if n else 0.0
        said["observed"] = _planning(n, share, "observed", decidable_margin(n, share))
    return said


def preflight_line(section: dict) -> str:
    """The summary's line: what the examples could decide, assumed before the run and observed after it."""
    assumed, observed = section["assumed"], section.get("observed")
    said = (
        f"{assumed['examples']:,} examples decide an accuracy margin of {assumed['smallest_margin']:.4f} with "
        f"80% power at the assumed discordance {assumed['discordance']:.3g}"
    )
    if observed:
        said += f"; at the observed {observed['discordance']:.3g}: {observed['smallest_margin']:.4f}"
    return said
