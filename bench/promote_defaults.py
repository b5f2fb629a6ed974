"""Can the default rollout gate be passed, and does it still stop a real drop? The default margin behind eval,
`make promote`, compose's promote profile and the Kubernetes promote Job (MAX_DROP=auto), measured on a small and
a large held-out set (bench/promote_tasks.py):

- the demo's 355 held-out rows (the default CNN on digits, 20 epochs): retrains with seeds 1..N against stable
  (seed 0), and each retrain with three planted 5-point drops (5 % of the examples it gets right, answered with
  another class);
- a user's own npz with 6,000 held-out rows (a seeded synthetic task, retrains near 0.97 accuracy): the same
  retrains, each with a planted 1.3-point drop spread over all classes and a 0.85-point drop inside one class.

Every candidate is gated as eval gates it (trainserve.evaluation.comparison.paired_metric, then
noninferiority.margin_gate), under each margin rule. Prints the rules' table, the observed discordance, and the
exact chance (trainserve.stats.gate_power) that the default passes a candidate truly 3, 2, 1 or 0 points worse.
Also the exact chance equal versions pass --max-drop-per-slice on ten slices, unadjusted and adjusted. --write
puts the tables into docs/evidence.md (tests/test_preflight.py checks the exact ones).

    python bench/promote_defaults.py [--seeds 10] [--write]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from promote_tasks import answers, planted  # noqa: E402

from trainserve.evaluation.comparison import paired_metric  # noqa: E402
from trainserve.evaluation.noninferiority import Margin, margin_gate  # noqa: E402
from trainserve.evaluation.preflight import CEILING, FLOOR, default_margin  # noqa: E402
from trainserve.stats.gate_power import decidable_margin, pass_probability  # noqa: E402

DOC = Path(__file__).resolve().parents[1] / "docs" / "evidence.md"
ASSUMED = 0.03  # eval's --assume-discordance default
RULES = {
    "fixed 0.04 (the old default)": lambda n: 0.04,
    "fixed 0.02": lambda n: 0.02,
    "fixed 0.01": lambda n: 0.01,
    "80 % power at 0.03, no floor or ceiling": lambda n: decidable_margin(n, ASSUMED),
    f"**auto: 80 % power at 0.03, within [{FLOOR:g}, {CEILING:g}]**": lambda n: default_margin(n, ASSUMED).drop,
}
TRUE_DROPS, DISCORDANCES, SIZES = (0.03, 0.02, 0.01, 0.0), (0.03, 0.05, 0.08), (355, 6000)
SLICE_CASES = ((6000, 0.02), (6000, 0.03), (20000, 0.01))


def gate(candidate: np.ndarray, stable: np.ndarray, truth: np.ndarray, drop: float) -> bool:
    """Whether the non-inferiority gate eval applies passes these answers at `drop`."""
    metric = paired_metric("accuracy", (candidate == truth) * 1.0, (stable == truth) * 1.0, 0.05, 0)
    comparison = {"metrics": {"accuracy": metric}, "baseline": {"version": 1}, "level": 0.95}
    return margin_gate(Margin("accuracy", drop), comparison)["passed"]


def candidates(task: str, epochs: int, seeds: int, cache: Path) -> tuple[np.ndarray, np.ndarray, dict]:
    """truth, stable's answers, and the named groups of candidates."""
    truth, predicted = answers(task, epochs, range(seeds + 1), cache)
    stable, retrains = predicted[0], [predicted[s] for s in range(1, seeds + 1)]
    if task == "demo":
        drops = [planted(p, truth, 0.05, s + 100 * k) for s, p in enumerate(retrains, 1) for k in range(3)]
        return truth, stable, {"retrains": retrains, "5-point drops": drops}
    one_class = int(np.bincount(truth).argmax())
    spread = [planted(p, truth, 0.013, s) for s, p in enumerate(retrains, 1)]
    concentrated = [planted(p, truth, 0.0085, s, within=one_class) for s, p in enumerate(retrains, 1)]
    return truth, stable, {"retrains": retrains, "1.3-point drops": spread, "0.85-point one-class drops": concentrated}


def describe(task: str, truth: np.ndarray, stable: np.ndarray, groups: dict) -> None:
    retrains = groups["retrains"]
    accuracy = [float(np.mean(p == truth)) for p in retrains]
    discordance = [float(np.mean((p == truth) != (stable == truth))) for p in retrains]
    print(
        f"{task}: {len(truth)} held-out rows, stable {np.mean(stable == truth):.4f}, retrains {min(accuracy):.4f}-"
        f"{max(accuracy):.4f}, discordance median {np.median(discordance):.4f} ({min(discordance):.4f}-"
        f"{max(discordance):.4f})"
    )


def rule_table(tasks: dict) -> str:
    """Markdown: per rule, the margin on each set and how many candidates of each group pass or are refused."""
    header = "| rule | margin, 355 rows | demo retrains pass | 5-point drops pass "
    header += "| margin, 6,000 rows | retrains pass | 1.3-point drops refused | 0.85-point one-class drops refused |"
    lines = [header, "|" + "---|" * 8]
    for name, rule in RULES.items():
        cells = [name]
        for task, (truth, stable, groups) in tasks.items():
            margin = rule(len(truth))
            cells.append(f"{margin:.4f}")
            for group, members in groups.items():
                passed = sum(gate(p, stable, truth, margin) for p in members)
                shown = passed if group == "retrains" or task == "demo" else len(members) - passed
                cells.append(f"{shown} of {len(members)}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def probability_table() -> str:
    """Markdown: the exact chance the default margin passes a candidate truly 3, 2, 1 or 0 points worse, spread
    over the classes, per held-out size and discordance."""
    columns = [(n, psi) for n in SIZES for psi in DISCORDANCES]
    head = " | ".join(
        f"{n:,} rows (margin {default_margin(n, ASSUMED).drop:g}), discordance {psi:g}" for n, psi in columns
    )
    lines = [f"| true drop | {head} |", "|" + "---|" * (len(columns) + 1)]
    for drop in TRUE_DROPS:
        cells = [
            f"{pass_probability(n, default_margin(n, ASSUMED).drop, psi, drop):.1%}" if drop <= psi else "-"
            for n, psi in columns
        ]
        lines.append(f"| {100 * drop:g} point{'' if drop == 0.01 else 's'} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def slice_power_table() -> str:
    """Markdown: the exact chance equal versions pass --max-drop-per-slice on ten equal slices (independent), each
    slice judged on its own 95 % interval (one-sided 2.5 %) or on Holm's Bonferroni-level one (2.5 % / 10)."""
    lines = [
        "| held-out rows (10 slices) | margin | discordance | each slice unadjusted (eval) | Bonferroni-adjusted |",
        "|---|---|---|---|---|",
    ]
    for n, margin in SLICE_CASES:
        for psi in (0.03, 0.06):
            alone, adjusted = (pass_probability(n // 10, margin, psi, alpha=a) ** 10 for a in (0.025, 0.0025))
            lines.append(f"| {n:,} | {margin:g} | {psi:g} | {alone:.1%} | {adjusted:.1%} |")
    return "\n".join(lines)


def exact_tables() -> dict[str, str]:
    """The tables computed exactly, with no training: what tests/test_preflight.py checks on the page."""
    return {"promotion-probability": probability_table(), "slice-power": slice_power_table()}


def write(doc: Path, name: str, table: str) -> None:
    """Replace the block between `<!-- bench: NAME -->` and `<!-- /bench -->` in `doc` with `table`."""
    pattern = re.compile(rf"(<!-- bench: {name} -->\n)(?:(?!<!-- /bench -->).*\n)*(<!-- /bench -->)")
    text = doc.read_text()
    if not pattern.search(text):
        raise SystemExit(f"{doc}: no <!-- bench: {name} --> block")
    doc.write_text(pattern.sub(lambda m: m[1] + table + "\n" + m[2], text))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--demo-epochs", type=int, default=20, help="the demo's epochs (.env EPOCHS, DEMO_EPOCHS)")
    parser.add_argument("--large-epochs", type=int, default=10, help="the synthetic task's epochs")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "trainserve-promote-defaults")
    parser.add_argument("--write", action="store_true", help="write the tables into docs/evidence.md")
    args = parser.parse_args()
    started = time.perf_counter()
    tasks = {
        "demo": candidates("demo", args.demo_epochs, args.seeds, args.cache),
        "large": candidates("large", args.large_epochs, args.seeds, args.cache),
    }
    for task, (truth, stable, groups) in tasks.items():
        describe(task, truth, stable, groups)
    tables = {"promote-defaults": rule_table(tasks), **exact_tables()}
    print("\n\n".join(tables.values()))
    print(f"({time.perf_counter() - started:.0f} s, trained answers cached in {args.cache})")
    if args.write:
        for name, table in tables.items():
            write(DOC, name, table)


if __name__ == "__main__":
    main()
