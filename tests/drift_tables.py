"""Undrifted traffic for drift's false-alarm measurements (tests/test_drift_stats.py, bench/drift_false_alarms.py):
a table of 31 features of the shapes production has (normal with missing cells, skewed, tied integers, rare
events, a long tail of categories, 20 columns of one matrix), profiled as training profiles it, and samples of
any size drawn from the same distribution, judged the way `trainserve drift` judges them."""

from __future__ import annotations

import numpy as np

from trainserve.data_profile import count_traffic, profile_inputs
from trainserve.drift.compare import judge
from trainserve.drift.run import VersionTraffic, compare_version

CITIES = np.array([f"city-{i:03d}" for i in range(300)])
CITY_SHARES = 1 / np.arange(1, 301) ** 1.1 / np.sum(1 / np.arange(1, 301) ** 1.1)  # Zipf: a long tail of rare ones


def table(rows: int, seed: int, age_shift: float = 0.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    age = rng.normal(40 + age_shift, 10, rows)
    age[rng.random(rows) < 0.05] = np.nan
    return {
        "age": age,
        "income": rng.lognormal(10, 0.5, rows),
        "pixels": rng.binomial(16, 0.3, rows).astype(np.float64),  # 17 values: deciles tie
        "visits": rng.poisson(2, rows).astype(np.float64),
        "fraud": (rng.random(rows) < 0.03).astype(np.float64),  # one edge: rare events
        "score": rng.random(rows),
        "wait": rng.exponential(3, rows),
        "colour": np.array(["red", "green", "blue"])[rng.choice(3, rows, p=[0.5, 0.3, 0.2])],
        "size": np.array(["S", "M", "L"])[rng.choice(3, rows)],
        "city": CITIES[rng.choice(len(CITIES), rows, p=CITY_SHARES)],
        "embedding": rng.normal(0, 1, (rows, 20)),
        "channel": np.array(["web", "app"])[rng.choice(2, rows, p=[0.7, 0.3])],
    }


def training_profile(rows: int = 6000, seed: int = 0) -> dict:
    return profile_inputs(table(rows, seed))


def judged(profile: dict, sample: dict[str, np.ndarray], max_psi: float = 0.25, max_unseen: float = 0.01) -> list:
    """The sample's feature rows, judged as `trainserve drift` judges them."""
    side = VersionTraffic(1, profile, counts=count_traffic(profile, sample))
    rows = compare_version(side)
    for row in rows:
        judge(row, max_psi, max_unseen)
    return rows
