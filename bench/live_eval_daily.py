"""`trainserve live-eval --state` run daily after a promotion, on late labels: how often a version whose live
accuracy drops 5 points at promotion is shown (and, with --on-drop rollback, rolled back) within the number of
daily runs the command states a week in, and how often an unchanged version is, over 30 daily looks.

Seeded simulation through the watch's own code (trainserve.live.state counts each run's labels by example key,
trainserve.live.sequential judges): each day the version answers ANSWERS requests (one example each); three in
four get a label, 20 % the same day, 40 % a day later, 25 % two days and 15 % three days later; each night's run
reads every label that has arrived for the answers of the last 7 days (a cumulative labels file, `--since 7d`),
so most labels are read again on later nights. A tenth of the nights the Job is retried (the same run twice), a
tenth it does not run (the next night counts two days' labels). --max-drop 0.02, --level 0.95.

Baselines: the held-out accuracy of the eval report (0.95 on N examples, drawn per run: the held-out split's own
noise), counted with its uncertainty; the same, taken as exact (what the watch does when the report is gone); and
`previous` paired on shadowed traffic (both versions 0.95 as promoted, disagreeing on 6 % of examples; after the
drop 0.90, disagreeing on 6 %).

    python bench/live_eval_daily.py [--runs 1000] [--write]
"""

from __future__ import annotations

import argparse
import datetime
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from promote_defaults import write  # noqa: E402

from trainserve.live.sequential import (  # noqa: E402
    Baseline,
    Pace,
    change_bounds,
    one_sided_alpha,
    runs_to_show,
    verdict,
)
from trainserve.live.state import WatchState  # noqa: E402
from trainserve.live.watch import labels_per_day  # noqa: E402

DOC = Path(__file__).resolve().parents[1] / "docs" / "how-to" / "live-accuracy.md"
ACCURACY, DROP, MARGIN, LEVEL = 0.95, 0.05, 0.02, 0.95
LABELLED, DELAYS, SINCE_DAYS = 0.75, (0.2, 0.4, 0.25, 0.15), 7
RETRIED, MISSED = 0.1, 0.1
LOOKS, STATED_ON, MAX_DAYS = 30, 7, 60  # unchanged: 30 looks; the stated runs as printed on day 7
NOT_YET = -1  # no number stated yet (None: stated that it would not show within two years)
# paired outcomes (both right, only the promoted version right, only previous right, both wrong)
PAIRED = {False: (0.92, 0.03, 0.03, 0.02), True: (0.895, 0.005, 0.055, 0.045)}


@dataclass(frozen=True)
class Scenario:
    name: str
    held_out: int | None  # held-out examples (None: paired against previous)
    answers: int  # a day
    exact: bool = False  # the held-out accuracy taken as exact


SCENARIOS = (
    Scenario("held-out 10,000", 10000, 400),
    Scenario("held-out 10,000", 10000, 1500),
    Scenario("held-out 1,000", 1000, 400),
    Scenario("held-out 1,000, taken as exact (report gone)", 1000, 400, exact=True),
    Scenario("previous, paired (shadowed)", None, 400),
)


def traffic(rng, scenario: Scenario, dropped: bool, days: int):
    """Per answer: its id, day, whether labelled and when the label arrives, right (and previous right)."""
    n = days * scenario.answers
    day = np.repeat(np.arange(days), scenario.answers)
    arrives = day + rng.choice(len(DELAYS), n, p=DELAYS)
    labelled = rng.random(n) < LABELLED
    if scenario.held_out is None:
        kind = rng.choice(4, n, p=PAIRED[dropped])
        return np.arange(n, dtype=np.uint64), day, arrives, labelled, np.isin(kind, (0, 1)), np.isin(kind, (0, 2))
    right = rng.random(n) < ACCURACY - (DROP if dropped else 0.0)
    return np.arange(n, dtype=np.uint64), day, arrives, labelled, right, None


def baseline(rng, scenario: Scenario) -> Baseline:
    if scenario.held_out is None:
        return Baseline("previous", version=1)
    correct = int(rng.binomial(scenario.held_out, ACCURACY))
    if scenario.exact:
        return Baseline("held-out", correct / scenario.held_out)
    return Baseline("held-out", correct / scenario.held_out, correct, scenario.held_out)


def one_run(rng, scenario: Scenario, dropped: bool, days: int) -> tuple[int | None, int | None]:
    """(the run, counting the nights run, that first showed a drop, or None; the runs stated on day 7)."""
    keys, day, arrives, labelled, right, previous = traffic(rng, scenario, dropped, days)
    state = WatchState("m", 2, "t", baseline(rng, scenario), MARGIN, LEVEL)
    alpha, shown, stated, nights = one_sided_alpha(LEVEL), None, NOT_YET, 0
    for today in range(days):
        if shown is not None and stated is not NOT_YET:
            break
        if rng.random() >= MISSED:
            nights += 1
            read = labelled & (arrives <= today) & (day > today - SINCE_DAYS)
            for _ in range(2 if rng.random() < RETRIED else 1):
                run = state.count(keys[read], right[read].astype(np.int8), _other(previous, read))
                state.runs.append({"time": _iso(today), **run})
                if (
                    shown is None
                    and verdict(change_bounds(state.counts, state.baseline, alpha), MARGIN) == "drop shown"
                ):
                    shown = nights
        if stated is NOT_YET and today + 1 >= STATED_ON:
            stated = _stated(state, alpha, nights)
    return shown, None if stated is NOT_YET else stated


def _other(previous, read):
    return None if previous is None else previous[read].astype(np.int8)


def _stated(state: WatchState, alpha: float, nights: int) -> int | None:
    """What the command prints: the runs in all after which the drop shows, at the pace seen so far."""
    c = state.counts
    pace = Pace(nights, c.examples, labels_per_day(state.runs), (c.only + c.baseline_only) / max(c.examples, 1))
    return runs_to_show(pace, state.baseline, MARGIN, alpha)


def _iso(day: int) -> str:
    return datetime.datetime.fromtimestamp(1_790_000_000 + day * 86400, datetime.UTC).isoformat()


def row(rng, scenario: Scenario, runs: int) -> str:
    """The scenario's line: the runs stated on day 7, how often the drop showed within them (of the runs where a
    number was stated), the median day it showed, and how often an unchanged version was shown in 30 looks."""
    shown_days, stated_all = [], []
    for _ in range(runs):
        shown, stated = one_run(rng, scenario, True, MAX_DAYS)
        stated_all.append(stated)
        shown_days.append(shown if shown is not None else math.inf)
    said = [(shown, stated) for shown, stated in zip(shown_days, stated_all) if stated is not None]
    within = sum(shown <= stated for shown, stated in said)
    false = sum(one_run(rng, scenario, False, LOOKS)[0] is not None for _ in range(runs))
    numbers = sorted(stated for _, stated in said)
    stated_words = (
        f"{numbers[len(numbers) // 2]} ({numbers[len(numbers) // 20]}-{numbers[-1 - len(numbers) // 20]})"
        if numbers
        else "none"
    )
    share = f"{100 * within / len(said):.1f} %" if said else "n/a"
    return (
        f"| {scenario.name} | {round(scenario.answers * LABELLED)} | {100 * len(said) / runs:.0f} % | {stated_words} "
        f"| {share} | {_days(np.median(shown_days))} | {100 * false / runs:.1f} % |"
    )


def _days(value: float) -> str:
    return f"{value:.0f}" if math.isfinite(value) else f"> {MAX_DAYS}"


HEADER = [
    "| baseline | labels a day | a number stated on day 7 | runs stated: median (5-95 %) | 5-point drop shown "
    "within them | median run shown | unchanged: shown (rolled back) within 30 looks |",
    "|---|---|---|---|---|---|---|",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000, help="simulated promotions per row and scenario")
    parser.add_argument("--write", action="store_true", help="write the table into docs/how-to/live-accuracy.md")
    args = parser.parse_args()
    rng, started = np.random.default_rng(0), time.perf_counter()
    print("\n".join(HEADER), flush=True)
    rows = []
    for scenario in SCENARIOS:
        rows.append(row(rng, scenario, args.runs))
        print(rows[-1], flush=True)
    noise = 100 * math.sqrt(0.05 * 0.95 / args.runs)
    print(f"({args.runs} runs a cell; +-{noise:.1f} points by chance at 5 %; {time.perf_counter() - started:.0f} s)")
    if args.write:
        write(DOC, "live-eval-daily", "\n".join(HEADER + rows))


if __name__ == "__main__":
    main()
