"""Whether a mean's interval can be trusted at all: the tail check the regression gates refuse to pass on.

An interval of a mean (Student's, Welch's, Hall's skew correction of either, the bootstrap-t) rests on the
sample's standard error. Where the size of the error varies with the input (a per-example scale that is
log-normal, say), squared errors and their paired differences have tails so long that a few hundred examples
rarely see them: the mean and the standard error then come out too small together, and a candidate exactly at
the margin passes a one-sided 2.5 % gate 5-20 % of the time, whatever the interval. No interval of a mean holds
for every such shape at these sizes (Bahadur and Savage 1956), so the gates refuse to pass where the sample shows
that its standard error is itself uncertain.

The measure is the standard error's effective degrees of freedom: the variance of a sample variance is about
sigma^4 (kurtosis - 1) / n, so a variance estimated from n values is as uncertain as one from
2 n / (kurtosis - 1) normal values (n - 1 for normal values, whose kurtosis is 3). For a difference of two
independent means the two sides' shares combine as Welch-Satterthwaite's do, each side's kurtosis in place of
normal's 3. The sample kurtosis is taken no lower than 3, so the measure never exceeds Welch's degrees of freedom.
A gate refuses to pass when it is below MIN_DF: bench/live_eval_gates.py and bench/mean_intervals.py chose it,
the smallest that held 2.5 % (within the simulation's noise) at the margin in every heteroscedastic cell they run,
and state what it costs in power.

From additive sums (n and the sums of the first four powers), so windows and merged shards judge alike; the
fourth central moment from raw sums loses precision when the mean is far larger than the spread, as the third's
does (trainserve.stats.skewed_means).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MIN_DF = 40
NORMAL_KURTOSIS = 3.0


@dataclass(frozen=True)
class Side:
    """One sample's share of a standard error: its size, sample variance (ddof 1) and kurtosis."""

    n: int
    variance: float
    kurtosis: float


def side_from_sums(n: int, total: float, total_sq: float, total_cu: float, total_qu: float | None) -> Side | None:
    """The Side of n values from their four power sums (None: fewer than 2 values, or no fourth-power sum)."""
    if n < 2 or total_qu is None or not math.isfinite(total_qu):
        return None
    n, mean = int(n), float(total) / n
    m2 = max(float(total_sq) / n - mean * mean, 0.0)
    m4 = float(total_qu) / n - 4 * mean * float(total_cu) / n + 6 * mean**2 * float(total_sq) / n - 3 * mean**4
    kurtosis = max(m4 / (m2 * m2), NORMAL_KURTOSIS) if m2 > 0 else NORMAL_KURTOSIS
    return Side(n, m2 * n / (n - 1), kurtosis)


def side_from_values(values: np.ndarray) -> Side | None:
    v = np.asarray(values, np.float64)
    return side_from_sums(v.size, *(float(np.sum(v**p)) for p in (1, 2, 3, 4)))


def effective_df(sides: list[Side]) -> float:
    """The standard error's effective degrees of freedom: 2 over the relative variance of its square."""
    shares = [s.variance / s.n for s in sides]
    total = sum(shares)
    if total == 0:
        return math.inf
    spread = sum(share**2 * ((s.kurtosis - 1) / s.n + 2 / (s.n * (s.n - 1))) for share, s in zip(shares, sides))
    return 2 * total**2 / spread


def tail_check(sides: list[Side | None]) -> dict:
    """{df, enough, said}: whether the sample's tail leaves its standard error trustworthy enough to pass a gate
    on, and when not, why and about how many examples would do at the tail seen."""
    if any(s is None for s in sides):
        return {"df": None, "min_df": MIN_DF, "enough": False, "said": "no fourth-power sums to check the tail by"}
    df = effective_df(sides)
    enough = df >= MIN_DF
    n = sum(s.n for s in sides)
    said = f"the standard error rests on about {min(df, 1e9):.0f} examples' worth of the tail ({n:,} examples)"
    if not enough:
        needed = math.ceil(n * MIN_DF / max(df, 1e-9))
        said = (
            f"{said}, fewer than {MIN_DF}: the errors' tail is too heavy for {n:,} examples to bound the mean "
            f"(about {needed:,} would do at the tail seen)"
        )
    return {"df": df if math.isfinite(df) else None, "min_df": MIN_DF, "enough": enough, "said": said}
