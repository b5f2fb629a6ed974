"""The decision report as one self-contained HTML page (trainserve.html_page's pieces: one style, tables, PNGs
inlined), in the order a person asks: how it ended, what it started from, then each step's checks, bounds
against budgets at every look, counts per replica, then the holds and every move."""

from __future__ import annotations

import hashlib
from dataclasses import fields
from pathlib import Path

from trainserve import __version__
from trainserve.html_page import escape, figure, page, table
from trainserve.html_page import verdict as verdict_line
from trainserve.rollout import analysis
from trainserve.rollout.report.plots import draw_bounds, has_bounds
from trainserve.rollout.report.read import Account, Stint
from trainserve.rollout.report.words import bounds, budget, check_words, units, verdict
from trainserve.rollout.rollout_config import StepGate

# Records each image's decoded size in the page, as eval.html does: how a test in a browser sees that they decode.
SCRIPT = """window.addEventListener("load", function () {
  document.querySelectorAll("img").forEach(function (img) {
    img.setAttribute("data-natural-width", img.naturalWidth);
    img.setAttribute("data-natural-height", img.naturalHeight);
  });
});"""
PASSED = {"promoted": True, "rolled back": False, "rollback pending": False}


def render_page(account: Account, history: Path) -> str:
    body = [_header(account), verdict_line(PASSED.get(account.outcome), verdict(account)), _evidence(account)]
    body += [_stint(k, stint) for k, stint in enumerate(account.stints, 1)]
    body += [_holds(account), _timeline(account)]
    title = f"trainserve rollout: {account.model} v{account.candidate}"
    return page(title, body, f"trainserve {__version__}: the decision report of {history}", SCRIPT)


def _header(account: Account) -> str:
    start = account.start
    said = (
        f"model {account.model} version {account.candidate} against stable version {start['stable']}, plan "
        f"{start['plan']}; started {start.get('time', '')} by {start.get('by', '')}"
    )
    return f'<p id="header">{escape(said)}</p>'


def _evidence(account: Account) -> str:
    """The START record's evidence chain and the budgets it anchored."""
    start, gate = account.start, _gate(account.start.get("gate") or {})
    rows = [
        ["eval report", start.get("report")],
        ["its SHA-256", start.get("report_sha256")],
        ["the file now", _report_now(start)],
        ["offline disagreement", _disagreement(start.get("offline") or {})],
        ["error_ratio, shadow_errors budget", f"{gate.max_error_increase:+.4f}"],
        ["slow_calls budget", f"{gate.max_slow_increase:+.4f}"],
    ]
    if start.get("flips"):
        flips = analysis.flip_budget(start.get("offline") or {}, gate)
        rows.append(["flip_rate budget", flips[1] if flips else "none: no offline disagreement (the check holds)"])
    rows += [
        ["each check's error rate (alpha)", f"{gate.alpha:g}"],
        ["fewest units a check passes on", gate.min_requests],
        ["routing file", start.get("routing_file")],
    ]
    return "<h2>What it started from</h2>" + table(["what", "recorded"], rows, ident="evidence")


def _gate(recorded: dict) -> StepGate:
    """The thresholds the START record kept (a record from an older trainserve: today's defaults for the rest)."""
    known = {f.name for f in fields(StepGate)}
    return StepGate(**{k: v for k, v in recorded.items() if k in known})


def _report_now(start: dict) -> str:
    path = Path(start.get("report") or "")
    if not path.is_file():
        return "not found from where this page was rendered"
    same = hashlib.sha256(path.read_bytes()).hexdigest() == start.get("report_sha256")
    return "the same bytes (this SHA-256)" if same else "rewritten since: its SHA-256 differs"


def _disagreement(offline: dict) -> str:
    found = offline.get("disagreement")
    if not found:
        return "none recorded (no comparison of the two versions' classes)"
    said = f"{found['count']}/{found['examples']} examples, from the {found['source']}"
    if found.get("both_wrong") is not None:
        said += f" ({found['both_wrong']} wrong in both, not counted)"
    return f"{said}: version {found['candidate']} against {found['baseline']}"


def _stint(k: int, stint: Stint) -> str:
    again = ", entered again after a pause" if stint.again else ""
    last = stint.looks[-1].decision if stint.looks else "none yet"
    said = f"entered {stint.entered}; {len(stint.looks)} looks; the last decided: {last}"
    where = "After the promotion" if stint.words.startswith("bake") else f"Step {stint.index + 1}"
    parts = [f'<h2 id="step-{k}">{where}: {escape(stint.words)}{again}</h2><p>{escape(said)}</p>']
    if stint.looks:
        parts += [_checks(k, stint), *_plots(k, stint), _looks(k, stint)]
    parts.append(_replicas(k, stint))
    return "".join(parts)


def _checks(k: int, stint: Stint) -> str:
    """Each check at the stint's last look."""
    rows = [
        [c.name, c.result, bounds(c), budget(c), units(c), c.said]
        for c in stint.looks[-1].checks  # every look judges the same checks
    ]
    header = ["check", "at the last look", "bounds", "budget", "on", "said"]
    return table(header, rows, caption="each check at the last look", ident=f"checks-{k}")


def _plots(k: int, stint: Stint) -> list[str]:
    said = []
    for name in stint.check_names():
        if not has_bounds(stint, name):
            last = next(c for c in stint.looks[-1].checks if c.name == name)
            said.append(f'<p class="none" id="words-{k}-{name}">{escape(check_words(last))}</p>')
            continue
        caption = f"{name} at step {stint.index + 1}: its bounds at every look against its budget"
        said.append(figure(lambda out, n=name: draw_bounds(stint, n, out), caption, f"bounds-{k}-{name}"))
    return said


def _looks(k: int, stint: Stint) -> str:
    names = stint.check_names()
    rows = []
    for look in stint.looks:
        found = {c.name: f"{c.result} {bounds(c)}" for c in look.checks}
        rows.append([look.number, look.time, look.decision, *(found.get(n, "") for n in names)])
    looks = table(["look", "time", "decision", *names], rows, ident=f"looks-{k}")
    return f"<details><summary>every look ({len(rows)})</summary>{looks}</details>"


def _replicas(k: int, stint: Stint) -> str:
    if not stint.replicas:
        return f'<p id="replicas-{k}">No proxy replica counted anything in this step.</p>'
    instances = sorted({i for by in stint.replicas.values() for i in by})
    rows = [[name, *(by.get(i, 0) for i in instances), sum(by.values())] for name, by in stint.replicas.items()]
    header = ["counter", *instances, "all replicas"]
    return table(header, rows, caption="counted by each proxy replica over the step", ident=f"replicas-{k}")


def _holds(account: Account) -> str:
    if not account.holds:
        return '<h2>Holds</h2><p id="holds">No step held at its end.</p>'
    rows = [
        [h.stint.index + 1, h.stint.words, f"{h.first.number}-{h.last.number}", h.first.time, h.last.time, h.why]
        for h in account.holds
    ]
    header = ["step", "routing", "looks", "from", "to", "why (at the last look)"]
    return "<h2>Holds</h2>" + table(header, rows, ident="holds")


def _timeline(account: Account) -> str:
    rows = [[m.time, m.by, m.event, "" if m.step is None else m.step + 1, m.said] for m in account.moments]
    return "<h2>Every move</h2>" + table(["time", "by", "event", "step", "what"], rows, ident="timeline")
