"""A regression in one part hides in the average: the comparison again on each slice of the examples.

A slice is the examples sharing a value of a column: a CSV column, an npz key (`region` or `x_test/region`), the
class (`class`: an image folder's class folder, any classification's true label), crossed with `a,b`; an empty
or missing value is its own slice, `column=(missing)`. A classification comparison is always sliced by class too
(--slice adds slices, it does not take the classes away), a multi-target regression by target when not sliced.
Every slice gets a test on its own examples whose p-value agrees with its interval about 0 (McNemar's exact test
beside the paired score interval; for squared errors the p-value of the interval eval uses for a mean
difference, trainserve.stats.means.mean_difference_interval, from the same resamples), and the p-values of the
whole family are adjusted together (Holm by default, Benjamini-Hochberg when asked:
trainserve.stats.multiplicity), so that many slices do not make a finding out of chance.

The intervals are adjusted with them, so that no interval excludes 0 beside an adjusted p-value that is not
significant: under Holm each slice's interval is at level 1 - alpha / m (Bonferroni, m slices: it excludes 0
only where Holm rejects too; Holm may reject a few more), under Benjamini-Hochberg at 1 - R alpha / m, R the
slices it rejects (Benjamini and Yekutieli's false-coverage-rate intervals).

With --max-drop-per-slice each slice is judged non-inferior, inferior or inconclusive on its own unadjusted
1 - alpha interval (`margin_interval`): the gate passes only when every slice is non-inferior, an
intersection-union test, whose error (passing while some slice is truly worse by the margin) is at most that
slice's own one-sided alpha / 2 without any adjustment (Berger 1982). Adjusting would only cost power: equal
versions would pass ten slices far less often (docs/evidence.md). A slice too small to show anything is
inconclusive, never "same".
"""

from __future__ import annotations

import argparse
import zipfile

import numpy as np

from trainserve.errors import TrainserveError
from trainserve.evaluation.data import ArrayData, EvalData, NpzData
from trainserve.evidence.decision import metric_verdict
from trainserve.layout import SPLIT_INPUTS
from trainserve.margins import Margin, parse_margins
from trainserve.stats.means import mean_difference_interval, mean_difference_p_value
from trainserve.stats.multiplicity import METHODS, adjust, adjusted_level
from trainserve.stats.power import discordant_share, mdd_paired_proportions
from trainserve.stats.proportions import paired_proportion_interval
from trainserve.stats.significance import mcnemar_exact
from trainserve.stats.tails import side_from_values, tail_check

CLASS = "class"
MISSING = "(missing)"
SLICE_TESTS = {
    "classification": "McNemar's exact test",
    "regression": "Student's t and bootstrap-t tests of the mean difference of squared errors, the larger p",
}
SLICE_MARGIN_GATE = "slice-non-inferiority"
SLICED_METRICS = ("accuracy", "mse")  # a slice's primary metric: classification, regression


def parse_slice(text: str) -> tuple[str, ...]:
    """`region` or `region,device` (crossed) -> the columns."""
    columns = tuple(part.strip() for part in text.split(",") if part.strip())
    if not columns:
        raise argparse.ArgumentTypeError(f"{text!r}: expected COLUMN or COLUMN,COLUMN (crossed), e.g. region")
    return columns


def parse_slice_margin(text: str) -> Margin:
    """`accuracy=0.05` or `mse=10%`: the one margin every slice's primary metric is judged against."""
    margins = parse_margins(text)
    if len(margins) != 1 or margins[0].metric not in SLICED_METRICS:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected one METRIC=DROP[%] on a slice's metric ({' or '.join(SLICED_METRICS)}), "
            "e.g. accuracy=0.05"
        )
    return margins[0]


def slice_margin_problem(margin: Margin | None, task, sliced: bool) -> str | None:
    """A one-line reason when --max-drop-per-slice cannot be judged on this task's slices."""
    if margin is None:
        return None
    metric = "accuracy" if task.kind == "classification" else "mse"
    if margin.metric != metric:
        return f"--max-drop-per-slice {margin.describe()}: {task.kind} slices compare {metric}: expected {metric}=DROP"
    if task.kind == "regression" and task.targets == 1 and not sliced:
        return f"--max-drop-per-slice {margin.describe()}: a one-target regression has no slices: expected --slice"
    return None


def slice_keys(data: EvalData, spec: tuple[str, ...]) -> np.ndarray:
    """Each example's slice under `spec`, as text: `region=north` or `region=north,device=ios`."""
    parts = [np.char.add(f"{column}=", _named_values(_column(data, column))) for column in spec]
    keys = parts[0]
    for part in parts[1:]:
        keys = np.char.add(np.char.add(keys, ","), part)
    return keys


def _named_values(values: np.ndarray) -> np.ndarray:
    """Each value as text, an empty cell, None or NaN named `(missing)` (not a blank slice name)."""
    text = values.astype(str)
    missing = np.isin(np.char.strip(text), ["", "nan", "NaN", "None"])
    return np.where(missing, MISSING, text)


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
    kind: str,
    values: tuple[dict, dict],
    keys: list[tuple[str, np.ndarray]],
    alpha: float,
    correction: str,
    seed: int,
    margin: Margin | None = None,
) -> dict:
    """Per slice: counts, both versions' primary metric, its difference and its interval at the family's adjusted
    level, the slice's own test and its p-value adjusted over every slice; with `margin` (a
    noninferiority.Margin on the primary metric) each slice's non-inferiority verdict. Rows sorted by evidence
    (adjusted p, smallest first)."""
    rows, chosen = [], []
    for by, per_example in keys:
        for name in sorted(set(per_example.tolist())):
            chosen.append(_pairs_of(kind, values, per_example == name))
            rows.append({"by": by, "name": name, **_one_slice(kind, chosen[-1], alpha, seed)})
    if kind == "regression" and not keys:
        chosen = _per_target(values)
        rows = [
            {"by": "target", "name": f"target={t}", **_one_slice(kind, pair, alpha, seed)}
            for t, pair in enumerate(chosen)
        ]
    adjusted = adjust([r["p_value"] for r in rows], correction)
    level = adjusted_level(adjusted, alpha, correction)
    for row, pair, p in zip(rows, chosen, adjusted):
        row["p_adjusted"] = p
        row["significant"] = p < alpha
        row["interval"] = _interval(row, pair, level, seed)
        if margin is not None:  # every slice must pass: each on its own interval (an intersection-union test)
            row["margin_interval"] = row["interval"] if level == 1 - alpha else _interval(row, pair, 1 - alpha, seed)
            row["verdict"] = slice_verdict(row, margin.absolute(row["baseline"] or 0.0), kind == "classification")
    rows.sort(key=lambda r: (r["p_adjusted"], r["p_value"], r["name"]))
    table = {
        "metric": "accuracy" if kind == "classification" else "mse",
        "higher_is_better": kind == "classification",
        "correction": correction,
        "correction_name": METHODS[correction],
        "test": SLICE_TESTS[kind],
        "alpha": alpha,
        "interval_level": level,
        "rows": rows,
        "worse": [r["name"] for r in rows if r["significant"] and r["direction"] == "worse"],
    }
    if margin is not None:
        table["margin"] = {"threshold": margin.drop, "relative": margin.relative}
    return table


def slice_verdict(row: dict, margin: float, higher_is_better: bool) -> str:
    """A slice's non-inferiority verdict from its own unadjusted interval (`margin_interval`; a report written
    before it holds the adjusted `interval`): the rule promote re-derives it by."""
    interval = row.get("margin_interval") or row["interval"]
    return metric_verdict({"interval": interval, "higher_is_better": higher_is_better, "tail": row.get("tail")}, margin)


def _pairs_of(kind: str, values: tuple[dict, dict], chosen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The slice's per-example primary metric for both versions: right or wrong, or squared errors."""
    metric = "accuracy" if kind == "classification" else "mse"
    return values[0][metric][chosen], values[1][metric][chosen]


def _one_slice(kind: str, pair: tuple[np.ndarray, np.ndarray], alpha: float, seed: int) -> dict:
    mine, theirs = pair
    n = len(mine)
    if kind == "classification":
        mine, theirs = mine.astype(bool), theirs.astype(bool)
        b, c = int(np.sum(mine & ~theirs)), int(np.sum(~mine & theirs))
        return _row(n, mine.mean() if n else 0.0, theirs.mean() if n else 0.0, True, mcnemar_exact(b, c), alpha, (b, c))
    p = mean_difference_p_value(mine - theirs, seed=seed)  # the resamples _interval draws: they agree about 0
    row = _row(n, mine.mean() if n else 0.0, theirs.mean() if n else 0.0, False, p, alpha)
    return row | {"tail": tail_check([side_from_values(mine - theirs)])}  # a margin passes only where it allows


def _per_target(values: tuple[dict, dict]) -> list[tuple[np.ndarray, np.ndarray]]:
    """A multi-target regression's default slices: each target's squared errors, paired."""
    mine, theirs = values[0]["squared_per_target"], values[1]["squared_per_target"]
    return [(mine[:, t], theirs[:, t]) for t in range(mine.shape[1])]


def _interval(row: dict, pair: tuple[np.ndarray, np.ndarray], level: float, seed: int) -> list:
    """The slice's difference at `level`: the paired score interval from the row's discordant counts, or the
    interval of the mean difference of squared errors; [None, None] when the slice is too small."""
    n, discordant = row["examples"], row.get("discordant")
    if discordant is not None:
        b, c = discordant["candidate_only"], discordant["baseline_only"]
        return list(paired_proportion_interval(b, c, n, level)) if n else [None, None]
    mine, theirs = pair
    low, high = mean_difference_interval(mine - theirs, level, seed=seed)
    return [low, high] if np.isfinite(low) and np.isfinite(high) else [None, None]


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
        row["mdd"] = mdd_paired_proportions(n, discordant_share(b + c, n), alpha) if n else None
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


def slice_margin_gate(table: dict, baseline_version: int) -> dict:
    """--max-drop-per-slice: passes only when every slice is non-inferior on its adjusted interval; a slice that
    is inconclusive (too few examples to tell) fails it as an inferior one does, and is named as such."""
    margin = table["margin"]
    unit = "%" if margin["relative"] else ""
    failing = [r for r in table["rows"] if r["verdict"] != "non-inferior"]
    named = [f"{r['name']} {r['verdict']} (n={r['examples']})" for r in failing]
    return {
        "kind": SLICE_MARGIN_GATE,
        "metric": table["metric"],
        "op": "max drop",
        "threshold": margin["threshold"],
        "relative": margin["relative"],
        "value": len(failing),
        "slices": [r["name"] for r in failing],
        "correction": table["correction"],
        "baseline_version": baseline_version,
        "passed": not failing,
        "said": f"{table['metric']} non-inferior to version {baseline_version} with a margin of "
        f"{margin['threshold']:g}{unit} on {len(table['rows']) - len(failing)} of {len(table['rows'])} slice(s) "
        f"(each on its own {100 * (1 - table['alpha']):.4g}% interval: every slice must pass, so no adjustment)"
        + (f"; not on {', '.join(named)}" if named else ""),
    }


SHOWN = 5  # slice rows in the summary; the report and report.html hold them all


def slice_lines(table: dict) -> list[str]:
    """The summary's slice lines: the first rows by evidence, and how many more the report holds."""
    rows = table["rows"]
    level = table.get("interval_level")
    lines = [
        f"  slices          {len(rows)} by evidence, p adjusted by {table['correction_name']}"
        + (f", intervals at {100 * level:.4g}% to match" if level is not None else "")
        + f"; significantly worse: {', '.join(table['worse']) or 'none'}"
        + (f"; verdicts on each slice's own {100 * (1 - table['alpha']):.4g}% interval" if "margin" in table else "")
    ]
    for r in rows[:SHOWN]:
        values = "" if r.get("candidate") is None else f"{r['candidate']:.4f} vs {r['baseline']:.4f}  "
        interval = _interval_text(r.get("interval"))
        lines.append(
            f"    {r['name'][:28]:<28} n={r['examples']:<6} {values}{interval}p={r['p_value']:.3g}  "
            f"adjusted {r['p_adjusted']:.3g}  {r.get('verdict') or r['direction']}"
        )
    if len(rows) > SHOWN:
        lines.append(f"    ... {len(rows) - SHOWN} more in the report")
    return lines


def _interval_text(interval: list | None) -> str:
    if not interval:
        return ""
    low, high = interval
    return "[n/a]  " if low is None else f"[{low:+.4f}, {high:+.4f}]  "
