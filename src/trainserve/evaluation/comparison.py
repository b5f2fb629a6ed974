"""The comparison section of a report: per metric both versions' values, the paired difference with its
interval at level 1 - alpha and the smallest difference the data could have shown (80 % power), the test that
decides the verdict, and the verdict line a person reads first.

Classification is decided by accuracy with McNemar's exact test; regression by MSE with a paired sign-flip
test on the per-example squared errors (trainserve.stats.significance says why those). "better" or "worse" only when the
test's p-value is below --alpha; otherwise "no significant difference", whatever the point estimates say, and
never "no difference": the detectable difference says how large a one could have gone unseen.

Intervals (trainserve.stats): accuracies, which are right or wrong per example, by the paired score interval that
agrees with McNemar's exact test; losses and errors, which are means of skewed, heavy-tailed values, by the union
of Student's t and the studentized (bootstrap-t) interval, which keeps the better of the two one-sided errors of
a non-inferiority gate on each shape (trainserve.stats.means; where neither holds 2.5 %, docs/evidence.md says
so with the table); RMSE, the root of a mean, by the paired percentile bootstrap (the resamples
and seed are recorded).
"""

from __future__ import annotations

import math

import numpy as np

from trainserve.evaluation.gates import HIGHER_IS_BETTER, PAIRED_METRICS
from trainserve.evaluation.metrics import (
    ClassificationMetrics,
    RegressionMetrics,
    latency_percentiles,
    log_probabilities,
)
from trainserve.evaluation.plan import Plan
from trainserve.evaluation.records import BatchAnswer, Tally
from trainserve.evaluation.slicing import slice_lines, slice_table, worse_line
from trainserve.evidence.decision import significantly_worse
from trainserve.stats.distributions import two_sided_z, z_quantile
from trainserve.stats.means import RESAMPLES, bootstrap_interval, mean, mean_difference_interval, root_mean
from trainserve.stats.power import POWER, discordant_share, mdd_mean, mdd_paired_proportions
from trainserve.stats.proportions import paired_proportion_interval
from trainserve.stats.significance import FLIPS, mcnemar_exact, sign_flip_test
from trainserve.stats.tails import side_from_values, tail_check

MCNEMAR = "McNemar's exact test"
SIGN_FLIP = "paired sign-flip test on squared errors (null: each example's difference is symmetric about 0)"
PROPORTIONS = frozenset({"accuracy", "top_k_accuracy"})  # right or wrong per example
INTERVAL_METHODS = {
    "proportions": "paired score interval (Tango), holding every difference McNemar's exact test does not reject",
    "mean": "union of Student's t and bootstrap-t (studentized) intervals of the mean paired difference",
    "bootstrap": "paired percentile bootstrap",
}


def per_example(answer: BatchAnswer, plan: Plan, quality: ClassificationMetrics | RegressionMetrics) -> dict:
    """What one answer says of each example, for the metrics compared example by example (their mean is the
    metric: RMSE is the root of the mean of `rmse`'s squared errors)."""
    labels, n = answer.labels, len(answer.labels)
    if plan.task.kind == "classification":
        log_p = log_probabilities(answer.output.reshape(n, -1), quality.kind or "probabilities")
        predicted = answer.classes.astype(np.int64) if answer.classes is not None else log_p.argmax(axis=1)
        k = min(quality.top_k, plan.task.classes)
        top = np.argpartition(-log_p, k - 1, axis=1)[:, :k]
        return {
            "accuracy": (predicted == labels).astype(np.float64),
            "top_k_accuracy": np.any(top == labels[:, None], axis=1).astype(np.float64),
            "loss": -log_p[np.arange(n), labels],
            "truth": labels,  # for the discordant pairs per class
        }
    error = answer.output.reshape(labels.shape).astype(np.float64) - labels
    squared = np.mean(error**2, axis=1)
    return {"mse": squared, "rmse": squared, "mae": np.mean(np.abs(error), axis=1), "squared_per_target": error**2}


def summarize(
    ref: str,
    versions: tuple[int, int],
    tallies: tuple[Tally, Tally],
    values: tuple[dict, dict],
    alpha: float,
    seed: int,
    slices: list[tuple[str, np.ndarray]] | None = None,
    correction: str = "holm",
    slice_margin=None,
) -> dict:
    """The report's `comparison`: evaluated (candidate) vs baseline on the same examples; `slices` (name, each
    example's slice) as --slice asks, and always by class (classification), or by target (several targets, not
    sliced); `slice_margin` (--max-drop-per-slice) judges each slice's non-inferiority."""
    kind = tallies[0].plan.task.kind
    metrics = {
        name: paired_metric(name, values[0][name], values[1][name], alpha, seed) for name in PAIRED_METRICS[kind]
    }
    if kind == "classification":
        test = _mcnemar(values, tallies[0])
    else:
        p = sign_flip_test(values[0]["mse"] - values[1]["mse"], seed=seed)
        test = {"name": SIGN_FLIP, "p_value": p, "flips": FLIPS}
    primary = PAIRED_METRICS[kind][0]
    verdict = _verdict(metrics[primary], test["p_value"], alpha)
    table = _slices(tallies[0].plan.task, values, slices, alpha, correction, seed, slice_margin)
    line = verdict_line(versions, verdict, primary, metrics[primary], test)
    return {
        "baseline": {"reference": ref, "version": versions[1]},
        "candidate_version": versions[0],
        "primary_metric": primary,
        "metrics": metrics,
        "test": test,
        "verdict": verdict,
        "verdict_line": line + (worse_line(table) if table else ""),
        "slices": table,
        "alpha": alpha,
        "level": 1 - alpha,
        "bootstrap": {"resamples": RESAMPLES, "seed": seed, "level": 1 - alpha},
        "latency_ms": {
            "candidate": latency_percentiles(tallies[0].latencies),
            "baseline": latency_percentiles(tallies[1].latencies),
        },
        "baseline_metrics": tallies[1].quality.summary(),
    }


def _slices(task, values: tuple[dict, dict], slices, alpha: float, correction: str, seed: int, margin) -> dict | None:
    slices = list(slices or [])
    if task.kind == "classification" and not any(by == "class" for by, _ in slices):
        names = np.asarray(task.label_names or [str(c) for c in range(task.classes)])
        slices.insert(0, ("class", np.char.add("class=", names[values[0]["truth"]])))  # every comparison per class
    elif not slices and not (task.kind == "regression" and task.targets > 1):
        return None  # one target, not sliced: the overall comparison is the only one
    return slice_table(task.kind, values, slices, alpha, correction, seed, margin)


def no_baseline(ref: str, version: int, said: str) -> dict:
    """A first rollout: the serving config labels no version `ref` yet (`said` how that is known), so the value
    gates alone decide, and the report says so."""
    line = f"v{version}: nothing to compare with ({said})"
    return {
        "baseline": {"reference": ref, "version": None},
        "candidate_version": version,
        "verdict": "no baseline",
        "verdict_line": line,
    }


def paired_metric(name: str, a: np.ndarray, b: np.ndarray, alpha: float, seed: int) -> dict:
    """One metric of both versions on the same examples: values, difference, its interval at 1 - alpha, the
    per-example standard deviation of the difference and the smallest difference detectable with 80 % power."""
    statistic = root_mean if name == "rmse" else mean
    tail = None  # a mean's: whether the differences' tail lets the interval be trusted (trainserve.stats.tails)
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    n, level = len(a), 1 - alpha
    candidate, baseline = float(statistic(a)), float(statistic(b))
    difference = candidate - baseline
    if name in PROPORTIONS:
        mine, theirs = a.astype(bool), b.astype(bool)
        only_mine, only_theirs = int(np.sum(mine & ~theirs)), int(np.sum(~mine & theirs))
        low, high = paired_proportion_interval(only_mine, only_theirs, n, level)
        share = discordant_share(only_mine + only_theirs, n, level)
        sd = math.sqrt(max(share - difference**2, 0.0))
        mdd, method = mdd_paired_proportions(n, share, alpha), "proportions"
    elif name == "rmse":
        low, high = bootstrap_interval(a, b, statistic, seed=seed, level=level)
        se = (high - low) / (2 * two_sided_z(level))  # the bootstrap's standard error, for sizing
        sd, method = se * math.sqrt(n), "bootstrap"
        mdd = (two_sided_z(level) + z_quantile(POWER)) * se if n > 1 else None
    else:
        low, high = mean_difference_interval(a - b, level, seed=seed)
        sd = float(np.std(a - b, ddof=1)) if n > 1 else 0.0
        mdd, method = mdd_mean(n, sd, alpha), "mean"
        tail = tail_check([side_from_values(a - b)])
    finite = math.isfinite(low) and math.isfinite(high)
    return {
        "candidate": candidate,
        "baseline": baseline,
        "difference": difference,
        "interval": [low, high] if finite else [None, None],
        "interval_method": INTERVAL_METHODS[method],
        "sd": sd,
        "mdd": mdd,
        "examples": n,
        "level": level,
        "higher_is_better": name in HIGHER_IS_BETTER,
    } | ({"tail": tail} if tail else {})


def _mcnemar(values: tuple[dict, dict], tally: Tally) -> dict:
    mine, theirs = (v["accuracy"].astype(bool) for v in values)
    table = {
        "both_right": int(np.sum(mine & theirs)),
        "candidate_only": int(np.sum(mine & ~theirs)),
        "baseline_only": int(np.sum(~mine & theirs)),
        "both_wrong": int(np.sum(~mine & ~theirs)),
    }
    names = list(tally.plan.task.label_names)
    truth = values[0]["truth"]
    per_class = [
        {
            "label": names[c],
            "candidate_only": int(np.sum(mine & ~theirs & (truth == c))),
            "baseline_only": int(np.sum(~mine & theirs & (truth == c))),
        }
        for c in range(len(names))
    ]
    p = mcnemar_exact(table["candidate_only"], table["baseline_only"])
    return {"name": MCNEMAR, "p_value": p, "discordant": table, "discordant_per_class": per_class}


def _verdict(metric: dict, p: float, alpha: float) -> str:
    if significantly_worse(metric, p, alpha):
        return "worse"
    if p >= alpha or metric["difference"] == 0:
        return "no significant difference"
    return "better"


def verdict_line(versions: tuple[int, int], verdict: str, primary: str, metric: dict, test: dict) -> str:
    """`v7 vs v6: worse (p=0.0012, McNemar's exact test; accuracy 0.9100 vs 0.9600, ...; detectable: 0.0214)`."""
    said = (
        f"v{versions[0]} vs v{versions[1]}: {verdict} (p={test['p_value']:.3g}, {test['name']}; {primary} "
        f"{metric['candidate']:.4f} vs {metric['baseline']:.4f}, difference {metric['difference']:+.4f}, "
        f"{_level(metric)} CI {_interval(metric)}"
    )
    if "discordant" in test:
        d = test["discordant"]
        said += f"; right only in v{versions[0]}: {d['candidate_only']}, only in v{versions[1]}: {d['baseline_only']}"
    return said + f"; {_detectable(metric)})"


def _level(metric: dict, level: float | None = None) -> str:
    return f"{100 * (level if level is not None else metric.get('level', 0.95)):g}%"


def _interval(metric: dict) -> str:
    low, high = metric["interval"]
    return "n/a" if low is None else f"[{low:+.4f}, {high:+.4f}]"


def _detectable(metric: dict) -> str:
    """What the data could have shown: the smallest difference detected with 80 % power."""
    mdd = metric.get("mdd")
    if mdd is None:
        return "too few examples or discordant pairs to detect any difference with 80% power"
    return f"smallest difference detectable with 80% power: {mdd:.4f}"


def levels_line(alpha: float) -> str:
    """The alpha conventions, where the numbers are read: the test and intervals are two-sided at alpha, a gate on
    an interval's end is one-sided at alpha / 2."""
    return (
        f"  levels          test and intervals two-sided at alpha {alpha:g} ({100 * (1 - alpha):g}%); a gate on an "
        f"interval's end (--max-drop) is one-sided at {100 * alpha / 2:g}%"
    )


def comparison_lines(c: dict) -> list[str]:
    """The summary's first lines: the verdict, then both versions side by side."""
    lines = [c["verdict_line"]]
    if c["baseline"]["version"] is None:
        return lines
    v, b = f"v{c['candidate_version']}", f"v{c['baseline']['version']}"
    level = _level({}, c.get("level", 0.95))
    lines.append(f"  {'':<15} {v:>10} {b:>10} {'difference':>11}  {level} CI             detectable (80% power)")
    for name, m in c["metrics"].items():
        mdd = "n/a" if m.get("mdd") is None else f"{m['mdd']:.4f}"
        lines.append(
            f"  {name:<15} {m['candidate']:>10.4f} {m['baseline']:>10.4f} {m['difference']:>+11.4f}  "
            f"{_interval(m):<20} {mdd}"
        )
    lines.append(levels_line(c.get("alpha", 0.05)))
    mine, theirs = c["latency_ms"]["candidate"], c["latency_ms"]["baseline"]
    for q in ("p50", "p99"):
        lines.append(f"  latency ms {q:<4} {mine[q]:>10.1f} {theirs[q]:>10.1f}")
    if "discordant" in c["test"]:
        d = c["test"]["discordant"]
        lines.append(
            f"  pairs           right only in {v}: {d['candidate_only']}, only in {b}: {d['baseline_only']}, "
            f"both: {d['both_right']}, neither: {d['both_wrong']}"
        )
    if c.get("preflight"):
        from trainserve.evaluation.preflight import preflight_line

        lines.append(f"  power           {preflight_line(c['preflight'])}")
    return lines + (slice_lines(c["slices"]) if c.get("slices") else [])
