"""A regression in one part hides in the average: the comparison again on each slice of the examples.

A slice is the examples sharing a value of a column: a CSV column, an npz key (`region` or `x_test/region`), the
class (`class`: an image folder's class folder, any classification's true label), crossed with `a,b`. Without
--slice a classification comparison is sliced by class and a multi-target regression by target. Every slice
gets the overall test on its own examples (McNemar's exact test; the sign-flip test on squared errors), and the
p-values of the whole family are adjusted together (Holm by default, Benjamini-Hochberg when asked:
multiplicity.py), so that many slices do not make a finding out of chance. Small slices stay in the table with
their counts; a slice too small to show anything says so through its detectable difference.
"""

from __future__ import annotations

import argparse
import zipfile

import numpy as np

from trainserve.errors import TrainserveError
from trainserve.evaluation.data import ArrayData, EvalData, NpzData
from trainserve.layout import SPLIT_INPUTS
from trainserve.stats.multiplicity import METHODS, adjust
from trainserve.stats.power import discordant_share, mdd_paired_proportions
from trainserve.stats.proportions import paired_proportion_interval
from trainserve.stats.significance import mcnemar_exact, sign_flip_test

CLASS = "class"
SLICE_FLIPS = 2000  # per slice: enough for p-values around 0.05 / slices to be told apart


def parse_slice(text: str) -> tuple[str, ...]:
    """`region` or `region,device` (crossed) -> the columns."""
    columns = tuple(part.strip() for part in text.split(",") if part.strip())
    if not columns:
        raise argparse.ArgumentTypeError(f"{text!r}: expected COLUMN or COLUMN,COLUMN (crossed), e.g. region")
    return columns


def slice_keys(data: EvalData, spec: tuple[str, ...]) -> np.ndarray:
    """Each example's slice under `spec`, as text: `region=north` or `region=north,device=ios`."""
    parts = [np.char.add(f"{column}=", _column(data, column).astype(str)) for column in spec]
    keys = parts[0]
    for part in parts[1:]:
        keys = np.char.add(np.char.add(keys, ","), part)
    return keys


def _column(data: EvalData, column: str) -> np.ndarray:
    """One value per example of a column of the data (or its class)."""
    if column == CLASS:
        names = np.asarray(data.label_names or [str(i) for i in range(int(np.max(data.labels, initial=0)) + 1)])
        labels = np.asarray(data.labels)
        return names[labels] if labels.dtype.kind in "iu" and labels.ndim == 1 else labels.astype(str)
    if isinstance(data, ArrayData) and column in data.arrays:
        values = np.asarray(data.arrays[column])
    elif isinstance(data, NpzData) and data.path is not None:
        values = _npz_column(data, column)
    else:
        values = None
    if values is None or len(values) < data.count or values.ndim != 1:
        known = sorted(data.arrays) if isinstance(data, ArrayData) else sorted(data.columns)
        raise TrainserveError(
            f"--slice {column}: {data.name} has no column {column!r} with one value per example: expected "
            f"{CLASS} or one of {', '.join(known) or 'none'}"
        )
    return values[: data.count]


def _npz_column(data: NpzData, column: str) -> np.ndarray | None:
    with zipfile.ZipFile(data.path) as archive:
        members = set(archive.namelist())
    for name in (column, f"{SPLIT_INPUTS}/{column}"):
        if f"{name}.npy" in members:
            with np.load(data.path, allow_pickle=False) as npz:
                return np.asarray(npz[name]).reshape(len(npz[name]), -1)[:, 0] if npz[name].ndim == 2 else npz[name]
    return None


def slice_table(
    kind: str, values: tuple[dict, dict], keys: list[tuple[str, np.ndarray]], alpha: float, correction: str, seed: int
) -> dict:
    """Per slice: counts, both versions' primary metric, its difference and interval, the slice's own test and
    its p-value adjusted over every slice; rows sorted by evidence (adjusted p, smallest first)."""
    rows = []
    for by, per_example in keys:
        for name in sorted(set(per_example.tolist())):
            chosen = per_example == name
            rows.append({"by": by, "name": name, **_one_slice(kind, values, chosen, alpha, seed)})
    if kind == "regression" and not keys:
        rows = _per_target(values, alpha, seed)
    for row, p in zip(rows, adjust([r["p_value"] for r in rows], correction)):
        row["p_adjusted"] = p
        row["significant"] = p < alpha
    rows.sort(key=lambda r: (r["p_adjusted"], r["p_value"], r["name"]))
    return {
        "metric": "accuracy" if kind == "classification" else "mse",
        "correction": correction,
        "correction_name": METHODS[correction],
        "alpha": alpha,
        "rows": rows,
        "worse": [r["name"] for r in rows if r["significant"] and r["direction"] == "worse"],
    }


def _one_slice(kind: str, values: tuple[dict, dict], chosen: np.ndarray, alpha: float, seed: int) -> dict:
    n = int(np.sum(chosen))
    if kind == "classification":
        mine, theirs = (v["accuracy"][chosen].astype(bool) for v in values)
        b, c = int(np.sum(mine & ~theirs)), int(np.sum(~mine & theirs))
        return _row(n, mine.mean(), theirs.mean(), True, mcnemar_exact(b, c), alpha, (b, c))
    mine, theirs = values[0]["mse"][chosen], values[1]["mse"][chosen]
    p = sign_flip_test(mine - theirs, flips=SLICE_FLIPS, seed=seed)
    return _row(n, mine.mean(), theirs.mean(), False, p, alpha)


def _per_target(values: tuple[dict, dict], alpha: float, seed: int) -> list[dict]:
    """A multi-target regression's default slices: each target's squared errors, paired."""
    mine, theirs = values[0]["squared_per_target"], values[1]["squared_per_target"]
    rows = []
    for t in range(mine.shape[1]):
        p = sign_flip_test(mine[:, t] - theirs[:, t], flips=SLICE_FLIPS, seed=seed)
        row = _row(len(mine), mine[:, t].mean(), theirs[:, t].mean(), False, p, alpha)
        rows.append({"by": "target", "name": f"target={t}", **row})
    return rows


def _row(n, candidate, baseline, higher_is_better, p, alpha, discordant=None) -> dict:
    difference = float(candidate - baseline)
    worse = difference < 0 if higher_is_better else difference > 0
    row = {
        "examples": n,
        "candidate": float(candidate) if n else None,
        "baseline": float(baseline) if n else None,
        "difference": difference if n else 0.0,
        "direction": "same" if difference == 0 or not n else "worse" if worse else "better",
        "p_value": float(p),
    }
    if discordant is not None:
        b, c = discordant
        row["discordant"] = {"candidate_only": b, "baseline_only": c}
        row["interval"] = list(paired_proportion_interval(b, c, n, 1 - alpha)) if n else [None, None]
        row["mdd"] = mdd_paired_proportions(n, discordant_share(b + c, n), alpha)
    return row


def worse_line(table: dict) -> str:
    """`; worse on class=3 (n=50, accuracy 0.00 vs 0.90, Holm-adjusted p=0.0004)` or nothing."""
    said = []
    for row in table["rows"]:
        if row["name"] in table["worse"]:
            said.append(
                f"{row['name']} (n={row['examples']}, {table['metric']} {row['candidate']:.4f} vs "
                f"{row['baseline']:.4f}, {table['correction']}-adjusted p={row['p_adjusted']:.3g})"
            )
    return f"; significantly worse on {'; '.join(said)}" if said else ""


def slice_gate(table: dict, baseline_version: int) -> dict:
    """--gate-slices: fails when any slice is significantly worse after the family's correction."""
    worse = table["worse"]
    return {
        "kind": "slice",
        "metric": table["metric"],
        "op": "not worse",
        "threshold": table["alpha"],
        "value": len(worse),
        "slices": list(worse),
        "correction": table["correction"],
        "baseline_version": baseline_version,
        "passed": not worse,
        "said": f"significantly worse than version {baseline_version} on {len(worse)} slice(s) "
        f"({table['correction']}-adjusted, alpha {table['alpha']:g}): {', '.join(worse) or 'none'}",
    }


SHOWN = 5  # slice rows in the summary; the report and report.html hold them all


def slice_lines(table: dict) -> list[str]:
    """The summary's slice lines: the first rows by evidence, and how many more the report holds."""
    rows = table["rows"]
    lines = [
        f"  slices          {len(rows)} by evidence, p adjusted by {table['correction_name']}"
        f"; significantly worse: {', '.join(table['worse']) or 'none'}"
    ]
    for r in rows[:SHOWN]:
        values = "" if r.get("candidate") is None else f"{r['candidate']:.4f} vs {r['baseline']:.4f}  "
        lines.append(
            f"    {r['name'][:28]:<28} n={r['examples']:<6} {values}p={r['p_value']:.3g}  "
            f"adjusted {r['p_adjusted']:.3g}  {r['direction']}"
        )
    if len(rows) > SHOWN:
        lines.append(f"    ... {len(rows) - SHOWN} more in the report")
    return lines
