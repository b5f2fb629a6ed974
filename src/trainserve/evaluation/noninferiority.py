"""Non-inferiority, the question a rollout asks: is the candidate no worse than the baseline by more than a
margin, with the comparison's confidence?

`--max-drop accuracy=0.01` allows accuracy to fall by at most one point; `--max-drop loss=5%` the loss to rise by
at most 5 % of the baseline's loss (the direction comes from the metric). The gate looks at the interval of the
change in the better direction (the "gain"), at level 1 - alpha:

- its lower end above -margin: **non-inferior**, the gate passes;
- its upper end below -margin: **inferior**, it fails;
- otherwise **inconclusive**: the data cannot tell, and the gate does not pass; the report says which way more
  examples would decide it if the observed difference held, and how many give 80 % power to show it.

The interval is two-sided at 1 - alpha, so each gate is one-sided at alpha / 2: 2.5 % at the default 95 %.

This is the bound-based form of a change threshold (`accuracy>=-0.01` judged on the interval's end, not on the
point estimate as TFMA's change thresholds and --require-vs-baseline are).
"""

from __future__ import annotations

from trainserve.evaluation.gates import PAIRED_METRICS
from trainserve.evidence.decision import gain_interval, metric_verdict, non_inferiority
from trainserve.margins import Margin
from trainserve.stats.power import would_decide

VERDICTS = ("non-inferior", "inconclusive", "inferior")


def check_margins(margins: tuple[Margin, ...], kind: str) -> str | None:
    """A one-line reason when a margin names a metric this task does not compare example by example."""
    for margin in margins:
        if margin.metric not in PAIRED_METRICS[kind]:
            return (
                f"--max-drop {margin.describe()}: {kind} compares {', '.join(PAIRED_METRICS[kind])} example by "
                "example: expected one of those"
            )
    return None


def judge(low: float | None, high: float | None, margin: float) -> str:
    """Non-inferior, inferior or inconclusive, from the interval [low, high] of the gain (better is positive):
    the rule promote re-derives the gate by (trainserve.evidence.decision)."""
    return non_inferiority(low, high, margin)


def margin_gate(margin: Margin, comparison: dict) -> dict:
    """The non-inferiority gate of one metric, from the comparison's interval, in the report's gate form: `value`
    is the lower end of the gain's interval, `passed` is value > -margin."""
    m, version = comparison["metrics"][margin.metric], comparison["baseline"]["version"]
    low, high = m["interval"]
    absolute = margin.absolute(m["baseline"])
    gain_low = gain_interval(m)[0]
    verdict = metric_verdict(m, absolute)
    refused = verdict != judge(*gain_interval(m), absolute)  # inside the margin, but the tail is too heavy
    gain = m["difference"] if m["higher_is_better"] else -m["difference"]
    decide = None
    if verdict == "inconclusive":  # one-sided alpha: half of what the two-sided interval leaves out
        decide = would_decide(gain, absolute, m.get("sd", 0.0), (1 - comparison.get("level", 0.95)) / 2)
    needed = decide.examples if decide else None
    unit = "%" if margin.relative else ""
    return {
        "kind": "non-inferiority",
        "metric": margin.metric,
        "op": "max drop",
        "threshold": margin.drop,
        "relative": margin.relative,
        "margin": absolute,
        "value": gain_low,
        "interval": [low, high],
        "verdict": verdict,
        "examples_needed": needed,
        "would_decide": decide.direction if decide else None,
        "mdd": m.get("mdd"),
        "candidate_value": m["candidate"],
        "baseline_value": m["baseline"],
        "baseline_version": version,
        "passed": verdict == "non-inferior",
        "default_margin": margin.default,
        "said": f"{margin.metric} is {verdict} to version {version} with a margin of {margin.drop:g}{unit} "
        f"(change {m['difference']:+.4f}, interval [{_num(low)}, {_num(high)}], allowed drop {absolute:.4g})"
        + (f"; not passed on the bound: {m['tail']['said']}" if refused else "")
        + (f"; {_would_decide(decide)}" if decide and not refused else ""),
    }


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.4f}"


def describe_margin_gate(gate: dict) -> str:
    """The summary's line: `accuracy non-inferior to v1 (drop at most 0.01: bound -0.0042, detectable 0.021)`."""
    unit = "%" if gate["relative"] else ""
    bound = "n/a" if gate["value"] is None else f"{gate['value']:+.4f}"
    mdd = "none (too few discordant pairs)" if gate.get("mdd") is None else f"{gate['mdd']:.4f}"
    said = (
        f"{gate['metric']} {gate['verdict']} to v{gate['baseline_version']} (drop at most {gate['threshold']:g}{unit}"
        f" = {gate['margin']:.4g}: bound of the change {bound}; detectable with 80% power {mdd}"
    )
    if gate.get("examples_needed"):
        direction = gate.get("would_decide") or "it"
        said += f"; about {gate['examples_needed']:,} examples would decide {direction} (80% power)"
    return said + ")"


def _would_decide(decide) -> str:
    return (
        f"about {decide.examples:,} examples would decide {decide.direction} with 80% power if the observed change held"
    )
