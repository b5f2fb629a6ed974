"""report.html's sections on what the evaluation could see: each compared metric's interval, how it was
computed and the smallest difference detectable with 80 % power (a single version's intervals without a
comparison), and the slice table sorted by evidence (the slices significantly worse first marked)."""

from __future__ import annotations

from html import escape


def interval_text(interval: list) -> str:
    low, high = interval
    return "n/a (too few examples)" if low is None or high is None else f"[{low:+.4f}, {high:+.4f}]"


def _rows(header: list[str], rows: list[list[str]], ident: str, marked: list[bool] | None = None) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    marked = marked or [False] * len(rows)
    body = "".join(
        f"<tr{' class=fail' if m else ''}>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>"
        for row, m in zip(rows, marked)
    )
    return f'<table id="{ident}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _number(value) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def what_it_could_see(report: dict) -> str:
    """Per metric: the interval, its method and the detectable difference; for one version, its intervals."""
    comparison = report.get("comparison") or {}
    if "metrics" not in comparison:
        rows = [
            [name, _number(i["value"]), interval_text(i["interval"]), f"{100 * i['level']:g}%", i["method"]]
            for name, i in (report.get("intervals") or {}).items()
        ]
        table = _rows(["metric", "value", "interval", "level", "method"], rows, "intervals")
        return f"<h2>What this evaluation could see</h2>{table}"
    rows = [
        [
            name,
            f"{m['difference']:+.4f}",
            interval_text(m["interval"]),
            _number(m.get("mdd")) if m.get("mdd") is not None else "none: too few examples or discordant pairs",
            str(m.get("examples", "")),
            m.get("interval_method", ""),
        ]
        for name, m in comparison["metrics"].items()
    ]
    level = f"{100 * comparison.get('level', 0.95):g}%"
    header = ["metric", "difference", f"{level} interval", "detectable with 80% power", "examples", "interval method"]
    note = (
        "<p>Evidence: a difference smaller than the detectable one may exist unseen; "
        '"no significant difference" is not "no difference". A gate judged on an interval\'s end (--max-drop) is '
        f"one-sided at {100 * (1 - comparison.get('level', 0.95)) / 2:g}% (the lower end of a two-sided {level} "
        "interval).</p>"
    )
    return f"<h2>What this evaluation could see</h2>{_rows(header, rows, 'evidence')}{note}"


def slice_table_rows(table: dict) -> list[list[str]]:
    """The slice table's rows, in the table's order (by evidence: adjusted p, smallest first)."""
    rows = []
    for r in table["rows"]:
        said = "significantly worse" if r["name"] in table["worse"] else r.get("verdict") or r["direction"]
        rows.append(
            [
                r["name"],
                str(r["examples"]),
                _number(r.get("candidate")),
                _number(r.get("baseline")),
                f"{r['difference']:+.4f}",
                interval_text(r["interval"]) if "interval" in r else "",
                *([interval_text(r.get("margin_interval") or r["interval"])] if "margin" in table else []),
                f"{r['p_value']:.3g}",
                f"{r['p_adjusted']:.3g}",
                said,
            ]
        )
    return rows


def slice_section(table: dict) -> str:
    level = table.get("interval_level")
    interval = "interval" if level is None else f"{100 * level:.4g}% interval"
    own = [f"{100 * (1 - table['alpha']):.4g}% interval (margin)"] if "margin" in table else []
    header = ["slice", "examples", "candidate", "baseline", "difference", interval, *own, "p", "adjusted p", "finding"]
    marked = [r["name"] in table["worse"] or r.get("verdict", "non-inferior") != "non-inferior" for r in table["rows"]]
    adjusted = "" if level is None else f"; intervals at {100 * level:.4g}% to match ({_interval_rule(table)})"
    caption = (
        f"<p>{escape(table['metric'])} per slice, sorted by evidence; p-values adjusted over all "
        f"{len(table['rows'])} slices by {escape(table['correction_name'])}, alpha {table['alpha']:g}"
        f"{escape(adjusted)}. Small slices stay, with their counts."
        + (_MARGIN_RULE if "margin" in table else "")
        + "</p>"
    )
    return f"<h2>Slices</h2>{caption}{_rows(header, slice_table_rows(table), 'slices', marked)}"


_MARGIN_RULE = (
    " Non-inferiority verdicts (--max-drop-per-slice) are judged on each slice's own unadjusted interval: every"
    " slice must pass, so the gate's error is already at most one slice's (an intersection-union test)."
)


def _interval_rule(table: dict) -> str:
    if table["correction"] == "bh":
        return "false coverage rate: 1 - R alpha / m, R the slices rejected"
    return "Bonferroni: 1 - alpha / m, never excluding 0 where Holm does not reject"
