"""What an evaluation can show, before and after it runs: sizing by the normal (or t) approximation of the test
in question, stated as such wherever it is reported. A sizing, never a verdict.

Conventions (the gates' own): a comparison gate is one-sided at alpha = 2.5 % (the lower end of a two-sided 95 %
interval); planning numbers are for 80 % power.

- Planning a non-inferiority gate (before any request): how many examples a margin needs, and the smallest
  margin `n` examples can decide, when the two versions are in truth equal. Paired accuracies (after Connor
  (1987)): each example's difference is -1, 0 or +1, with variance the discordant share psi, so
  n = (z_{1 - alpha} + z_{power})^2 psi / m^2. Means of paired differences (losses, squared errors): the same
  with the per-example standard deviation, and Student's t quantiles on n - 1 degrees of freedom.
- After an eval: the smallest difference a two-sided test at alpha had 80 % power to detect, and for an
  inconclusive gate which way more examples would decide it and how many (80 % power, if the observed
  difference is the truth).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainserve.stats.distributions import t_quantile, two_sided_z, z_quantile
from trainserve.stats.proportions import wilson_interval

POWER = 0.80
ALPHA = 0.025  # one-sided: the lower end of a two-sided 95 % interval
_MOST_EXAMPLES = 10**9  # beyond this the t search stops: no evaluation is that large


def discordant_share(discordant: int, n: int, level: float = 0.95) -> float:
    """The share of examples exactly one version gets right, for sizing: the observed one, or with none observed
    the upper end of its Wilson interval (none seen among n is not proof of none)."""
    if n <= 0:
        return 1.0
    return discordant / n if discordant else wilson_interval(0, n, level)[1]


def examples_to_decide(
    margin: float, discordant_share: float, alpha: float = ALPHA, power: float = POWER, gain: float = 0.0
) -> int | None:
    """Examples a paired-accuracy non-inferiority gate with `margin` needs to pass with `power`, at one-sided
    `alpha`, when the candidate's true accuracy change is `gain` (0: equal models) and a share `discordant_share`
    of examples is right in one version only. None when the gain is at or below -margin (no number passes)."""
    distance = gain + margin
    if distance <= 0:
        return None
    variance = max(discordant_share - gain * gain, 0.0)
    return max(1, math.ceil(((z_quantile(1 - alpha) + z_quantile(power)) / distance) ** 2 * variance))


def smallest_decidable_margin(
    n: int, discordant_share: float, alpha: float = ALPHA, power: float = POWER
) -> float | None:
    """The smallest margin a paired-accuracy non-inferiority gate on `n` examples passes with `power` (one-sided
    `alpha`) when the two versions are equal and `discordant_share` of examples is right in one only. None with
    no examples."""
    if n <= 0:
        return None
    return (z_quantile(1 - alpha) + z_quantile(power)) * math.sqrt(max(discordant_share, 0.0) / n)


def smallest_decidable_mean_margin(n: int, sd: float, alpha: float = ALPHA, power: float = POWER) -> float | None:
    """The mean analogue (losses, squared errors): the smallest margin on the mean paired difference that `n`
    examples with per-example standard deviation `sd` decide with `power` at one-sided `alpha` when the versions
    are equal, by Student's t on n - 1 degrees of freedom. None with fewer than 2 examples."""
    if n < 2:
        return None
    return (t_quantile(1 - alpha, n - 1) + t_quantile(power, n - 1)) * sd / math.sqrt(n)


def examples_to_decide_mean(
    margin: float, sd: float, alpha: float = ALPHA, power: float = POWER, gain: float = 0.0
) -> int | None:
    """Examples a non-inferiority gate on a mean paired difference (per-example standard deviation `sd`) needs to
    pass with `power` at one-sided `alpha` when the true change in the better direction is `gain`: the smallest n
    with (t_{1-alpha, n-1} + t_{power, n-1}) sd / sqrt(n) <= gain + margin. None when gain <= -margin."""
    return _examples_by_t(gain + margin, sd, alpha, power)


def _examples_by_t(distance: float, sd: float, alpha: float, power: float) -> int | None:
    if distance <= 0:
        return None
    if sd <= 0:
        return 2

    def enough(n: int) -> bool:
        return (t_quantile(1 - alpha, n - 1) + t_quantile(power, n - 1)) * sd / math.sqrt(n) <= distance

    start = max(2, math.ceil(((z_quantile(1 - alpha) + z_quantile(power)) * sd / distance) ** 2))
    high = start
    while not enough(high):  # the z answer is a lower bound: t's quantiles are larger
        high *= 2
        if high > _MOST_EXAMPLES:
            return None
    low = start - 1
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if enough(middle) else (middle, high)
    return high


@dataclass(frozen=True)
class WouldDecide:
    """Which way an inconclusive non-inferiority gate would go with more examples, if the observed change held,
    and how many examples would show it with 80 % power."""

    direction: str  # "non-inferior" or "inferior"
    examples: int


def would_decide(
    gain: float, margin: float, sd: float, alpha: float = ALPHA, power: float = POWER
) -> WouldDecide | None:
    """For an observed change `gain` (better is positive) against `margin`, per-example standard deviation `sd`:
    non-inferior when gain > -margin, inferior when below, with the examples that give `power` at one-sided
    `alpha` to see it (n = ((z_{1-alpha} + z_power) sd / |gain + margin|)^2). None when gain sits on -margin."""
    distance = gain + margin
    if distance == 0:
        return None
    direction = "non-inferior" if distance > 0 else "inferior"
    if sd <= 0:
        return WouldDecide(direction, 1)
    examples = math.ceil(((z_quantile(1 - alpha) + z_quantile(power)) * sd / abs(distance)) ** 2)
    return WouldDecide(direction, examples)


def mdd_paired_proportions(n: int, share: float, alpha: float = 0.05, power: float = POWER) -> float | None:
    """The smallest difference of paired accuracies McNemar's test at level `alpha` (two-sided) detects with
    `power` on `n` examples whose discordant share is `share`: the delta solving Connor's
    n = (z_a sqrt(share) + z_b sqrt(share - delta^2))^2 / delta^2. None when no difference the share allows
    (|delta| <= share) would be detected: too few discordant pairs to see anything."""
    if n <= 0 or share <= 0:
        return None
    z_a, z_b, root_n = two_sided_z(1 - alpha), z_quantile(power), math.sqrt(n)

    def excess(delta: float) -> float:  # > 0 while delta is too small to detect
        return z_a * math.sqrt(share) + z_b * math.sqrt(max(share - delta * delta, 0.0)) - delta * root_n

    top = min(share, 1.0)
    if excess(top) > 0:
        return None
    low, high = 0.0, top
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if excess(middle) > 0 else (low, middle)
    return high


def mdd_mean(n: int, sd: float, alpha: float = 0.05, power: float = POWER) -> float | None:
    """The smallest mean of paired differences (standard deviation `sd`) a two-sided t-test at `alpha` detects
    with `power` on `n` examples: (t_{1-alpha/2, n-1} + t_{power, n-1}) sd / sqrt(n), Student's quantiles (the
    normal's understate it by a third at n = 5). None with fewer than 2 examples."""
    if n < 2:
        return None
    return (t_quantile(1 - alpha / 2, n - 1) + t_quantile(power, n - 1)) * sd / math.sqrt(n)
