"""The gates a CronJob pages on: `--min-accuracy` (a version's live accuracy) and `--max-drop` (one version's
against another's on the same capture). Each is judged on an interval, not a point, with three verdicts:
shown to hold, shown to fail, or inconclusive (too few labels yet; `--inconclusive` says whether that passes).

--max-drop is paired where both versions answered the same labelled examples (shadowed traffic): the difference
of paired proportions (Tango's interval widened to agree with McNemar's exact test, as eval's comparison uses) on
the examples both answered. Where fewer than MIN_PAIRED were, it is unpaired: Newcombe's hybrid score interval
from the two versions' Wilson intervals, over each version's own labelled examples. The report says which.

For a regression model `--max-drop mse=X` (or mae=X, or X% of the baseline's value) judges the rise of the mean
squared (absolute) error: paired, the skew-corrected interval of the mean per-example difference on the examples
both answered; unpaired, the skew-corrected Welch interval of the difference of the two means (each over its own
labelled examples). Squared errors are skewed, where Student's and Welch's t put too little of their error on the
long side (trainserve.stats.skewed_means). Both come from additive sums, so merged shards judge alike.

Where the error's size varies with the input, no interval of a mean holds its rate at these sizes: a bound inside
the margin passes only when the sample's tail leaves its standard error about 40 examples' worth of certainty
(trainserve.stats.tails); otherwise the verdict is inconclusive, and the gate's `tail` and `said` say why and about
how many labelled examples would do. `--inconclusive pass` passes it, as it passes too few labels.
"""

from __future__ import annotations

from trainserve.errors import TrainserveError
from trainserve.evidence.decision import non_inferiority
from trainserve.live.config import drop_margin
from trainserve.stats.proportions import newcombe_interval, paired_proportion_interval, wilson_interval
from trainserve.stats.skewed_means import skewed_difference_interval, skewed_mean_interval
from trainserve.stats.tails import side_from_sums, tail_check

MIN_PAIRED = 30


def judged_versions(config, sections: dict[int, dict]) -> tuple[int | None, int | None]:
    """(the version the gates judge, --max-drop's baseline); one error line when the baseline is ambiguous."""
    if not sections:
        return None, None
    candidate = config.version if config.version is not None else max(sections)
    if config.version is not None and candidate not in sections:
        raise TrainserveError(f"--version {candidate}: no captured answer of it (versions captured: {_said(sections)})")
    baseline = config.baseline_version
    if config.max_drop is not None and baseline is None:
        others = [v for v in sections if v != candidate]
        if not others and config.watch.state is not None:  # the watch judges --max-drop; no version beside
            return candidate, None
        if len(others) != 1:
            raise TrainserveError(
                f"--max-drop: versions {_said(sections)} answered: expected --baseline-version to name the one "
                f"version {candidate} is compared with"
            )
        baseline = others[0]
    if baseline is not None and baseline not in sections:
        raise TrainserveError(f"--baseline-version {baseline}: no captured answer of it (captured: {_said(sections)})")
    return candidate, baseline


def _said(sections: dict) -> str:
    return ", ".join(str(v) for v in sorted(sections)) or "none"


def min_accuracy_gate(section: dict, threshold: float, level: float, inconclusive: str) -> dict:
    cell = section["overall"]
    low, high = wilson_interval(cell["correct"], cell["examples"], level)
    verdict = "below" if high < threshold else "meets" if low >= threshold else "inconclusive"
    passed = verdict == "meets" or (verdict == "inconclusive" and inconclusive == "pass")
    accuracy = "no labelled answers" if not cell["examples"] else f"{cell['accuracy']:.4f}"
    return {
        "kind": "min-accuracy",
        "version": section["version"],
        "threshold": threshold,
        "value": cell["accuracy"],
        "interval": [low, high],
        "examples": cell["examples"],
        "verdict": verdict,
        "passed": passed,
        "said": f"version {section['version']} accuracy {accuracy} on {cell['examples']} labelled examples "
        f"(interval [{low:.4f}, {high:.4f}]): {verdict} --min-accuracy {threshold:g}",
    }


def max_drop_gate(
    candidate: dict, baseline: dict, pair: dict | None, margin: float, level: float, inconclusive: str
) -> dict:
    """Accuracy of `candidate` minus `baseline`, paired on the examples both answered where there are enough."""
    paired = pair is not None and pair["examples"] >= MIN_PAIRED
    if paired:
        flip = pair["versions"][0] != candidate["version"]  # the pair counts as (smaller, larger) version
        cand_only, base_only = pair["first_only"], pair["second_only"]
        if flip:
            cand_only, base_only = base_only, cand_only
        n = pair["examples"]
        difference = (cand_only - base_only) / n
        low, high = paired_proportion_interval(cand_only, base_only, n, level)
        method = f"paired on {n} examples both answered (Tango/McNemar interval)"
    else:
        c, b = candidate["overall"], baseline["overall"]
        if not c["examples"] or not b["examples"]:
            difference, low, high, n = None, None, None, 0
        else:
            difference = c["accuracy"] - b["accuracy"]
            low, high = newcombe_interval(c["correct"], c["examples"], b["correct"], b["examples"], level)
        shared = pair["examples"] if pair else 0
        method = f"unpaired ({shared} examples answered by both, fewer than {MIN_PAIRED}; Newcombe's interval)"
    verdict = non_inferiority(low, high, margin)
    passed = verdict == "non-inferior" or (verdict == "inconclusive" and inconclusive == "pass")
    change = "n/a" if difference is None else f"{difference:+.4f}"
    bounds = "n/a" if low is None else f"[{low:+.4f}, {high:+.4f}]"
    return {
        "kind": "max-drop",
        "version": candidate["version"],
        "baseline_version": baseline["version"],
        "threshold": margin,
        "paired": paired,
        "method": method,
        "value": difference,
        "interval": None if low is None else [low, high],
        "verdict": verdict,
        "passed": passed,
        "said": f"version {candidate['version']} vs {baseline['version']}: accuracy change {change} {bounds}, "
        f"{method}: {verdict} with a margin of {margin:g}",
    }


def error_drop_gate(
    candidate: dict, baseline: dict, pair: dict | None, margin, level: float, inconclusive: str
) -> dict:
    """The rise of `candidate`'s mean error (mse or mae) over `baseline`'s, paired where there are enough pairs;
    judged as eval's --max-drop is: non-inferior when the interval's worse end stays within the margin."""
    metric = margin.metric
    kind = "squared_error" if metric == "mse" else "absolute_error"
    paired = pair is not None and pair["examples"] >= MIN_PAIRED
    c, b = candidate["overall"], baseline["overall"]
    if paired:
        n, sums = pair["examples"], pair["differences"][kind]
        sign = 1 if pair["versions"][0] == candidate["version"] else -1  # the pair holds first minus second
        ends = skewed_mean_interval(n, sums["sum"], sums["sum_sq"], sums["sum_cu"], level)
        difference = sign * sums["sum"] / n
        low, high = (None, None) if ends is None else sorted(sign * e for e in ends)
        method = f"paired on {n} examples both answered (skew-corrected t interval of the per-example difference)"
        tail = tail_check([_side(n, sums)])
    else:
        sides = [{"n": s["examples"], **s["errors"][kind]} for s in (c, b)]
        difference = None if not (c["examples"] and b["examples"]) else c[metric] - b[metric]
        low, high = skewed_difference_interval(*sides, level)
        shared = pair["examples"] if pair else 0
        method = f"unpaired ({shared} examples answered by both, fewer than {MIN_PAIRED}; skew-corrected Welch)"
        tail = tail_check([_side(s["n"], s) for s in sides])
    allowed = margin.absolute(b[metric] or 0.0)
    # Lower is better: the gain is minus the rise, so the gain's interval is the rise's, negated and swapped.
    verdict = non_inferiority(None if high is None else -high, None if low is None else -low, allowed)
    refused = verdict == "non-inferior" and not tail["enough"]
    if refused:  # the bound is inside the margin, but the tail seen says the bound cannot be trusted
        verdict = "inconclusive"
    passed = verdict == "non-inferior" or (verdict == "inconclusive" and inconclusive == "pass")
    change = "n/a" if difference is None else f"{difference:+.4g}"
    bounds = "n/a" if low is None else f"[{low:+.4g}, {high:+.4g}]"
    return {
        "kind": "max-drop",
        "metric": metric,
        "version": candidate["version"],
        "baseline_version": baseline["version"],
        "threshold": margin.drop,
        "relative": margin.relative,
        "margin": allowed,
        "paired": paired,
        "method": method,
        "value": difference,
        "interval": None if low is None else [low, high],
        "verdict": verdict,
        "tail": tail,
        "passed": passed,
        "said": f"version {candidate['version']} vs {baseline['version']}: {metric} change {change} {bounds}, "
        f"{method}: {verdict} with a margin of {margin.describe().partition('=')[2]} (allowed rise {allowed:.4g})"
        + (f"; not passed on the bound: {tail['said']}" if refused else ""),
    }


def _side(n: int, sums: dict):
    return side_from_sums(n, sums["sum"], sums["sum_sq"], sums["sum_cu"], sums.get("sum_qu"))


def judge_gates(config, sections: dict[int, dict], pairs: list[dict]) -> list[dict]:
    candidate, baseline = judged_versions(config, sections)
    gates = []
    if config.min_accuracy is not None and candidate is not None:
        gates.append(min_accuracy_gate(sections[candidate], config.min_accuracy, config.level, config.inconclusive))
    if config.max_drop is not None and candidate is not None and baseline is not None:
        pair = next((p for p in pairs if set(p["versions"]) == {candidate, baseline}), None)
        margin = drop_margin(config.max_drop)
        if margin.metric == "accuracy":
            gates.append(
                max_drop_gate(
                    sections[candidate], sections[baseline], pair, margin.drop, config.level, config.inconclusive
                )
            )
        else:
            gates.append(
                error_drop_gate(
                    sections[candidate], sections[baseline], pair, margin, config.level, config.inconclusive
                )
            )
    return gates
