"""How often `trainserve drift` flags undrifted traffic, and how often it catches a real shift, by sample size.

Undrifted traffic: samples of 50, 200 and 1,000 requests (one example each) drawn from the same distribution as
the 6,000 training rows of tests/drift_tables.py (31 features: normal with missing cells, skewed, tied integers,
rare events, a long tail of 300 categories, 20 columns of one matrix). Each sample's features are judged as drift
judges them (PSI past --max-psi 0.25 plus the sampling-noise allowance, or unseen share past 1 % plus its own);
printed beside the rule without an allowance (PSI > 0.25, unseen > 1 %). Then the share of samples in which
`age` moved by half and by one training standard deviation is flagged. Seeded: the same numbers every run.

    python bench/drift_false_alarms.py [--repeats 200]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from drift_tables import judged, table, training_profile  # noqa: E402

SIZES = (50, 200, 1000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200, help="samples per size")
    args = parser.parse_args()
    profile = training_profile()
    print(f"undrifted traffic, {args.repeats} samples per size, 31 features each")
    header = ("requests", "flagged", "without allowance", "too few", "age +0.5 sd", "age +1 sd")
    print("{:>8} {:>9} {:>18} {:>8}   {:>11} {:>9}".format(*header))
    for size in SIZES:
        flagged = naive = few = judged_count = 0
        for rep in range(args.repeats):
            rows = judged(profile, table(size, 1_000_000 + 1000 * size + rep))
            judged_count += len(rows)
            flagged += sum(r["drifted"] for r in rows)
            few += sum(r["verdict"] == "too few" for r in rows)
            naive += sum(r["psi"] > 0.25 or (r["unseen_share"] or 0) > 0.01 for r in rows)
        caught = {shift: _caught(profile, size, shift, args.repeats) for shift in (5.0, 10.0)}
        print(
            f"{size:>8} {flagged / judged_count:>9.2%} {naive / judged_count:>18.2%} {few / judged_count:>8.1%}"
            f"   {caught[5.0]:>11.0%} {caught[10.0]:>9.0%}"
        )


def _caught(profile: dict, size: int, shift: float, repeats: int) -> float:
    hits = 0
    for rep in range(repeats):
        rows = {r["feature"]: r for r in judged(profile, table(size, 2_000_000 + rep, age_shift=shift))}
        hits += rows["age"]["drifted"]
    return hits / repeats


if __name__ == "__main__":
    main()
