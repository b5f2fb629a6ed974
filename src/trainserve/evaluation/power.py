"""What an evaluation could have seen: the smallest difference it had 80 % power to detect, and how many
examples would decide a comparison its data left open.

Both by the normal approximation of the test in question (McNemar's for paired accuracies, after Connor (1987);
the mean's for paired per-example differences), stated as such in the report: a sizing, not a verdict.
"""

from __future__ import annotations

import math

from trainserve.evaluation.intervals import two_sided_z, wilson_interval, z_quantile

POWER = 0.80


def discordant_share(discordant: int, n: int, level: float = 0.95) -> float:
    """The share of examples exactly one version gets right, for sizing: the observed one, or with none observed
    the upper end of its Wilson interval (none seen among n is not proof of none)."""
    if n <= 0:
        return 1.0
    return discordant / n if discordant else wilson_interval(0, n, level)[1]


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
    """The smallest mean of paired differences (standard deviation `sd`) a two-sided test at `alpha` detects with
    `power` on `n` examples: (z_a + z_b) sd / sqrt(n). None with fewer than 2 examples."""
    if n < 2:
        return None
    return (two_sided_z(1 - alpha) + z_quantile(power)) * sd / math.sqrt(n)


def examples_to_decide(gain: float, margin: float, sd: float, level: float = 0.95) -> int | None:
    """How many examples would put the interval of a difference observed as `gain` (per-example standard
    deviation `sd`) wholly on one side of -margin: inside it (non-inferior) or beyond it (inferior), if the
    observed difference held. None when the observed difference sits on the margin (no number decides)."""
    distance = abs(gain + margin)
    if distance == 0:
        return None
    if sd <= 0:
        return 1
    return math.ceil((two_sided_z(level) * sd / distance) ** 2)
