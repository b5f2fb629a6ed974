"""A check's bounds at every look of a stint against its budget, as a PNG: the band the bounds span, the budget
as a line, each look marked by what the check found there (the axis around the budget: the exact bounds are in
the page's tables)."""

from __future__ import annotations

from trainserve.rollout import analysis
from trainserve.rollout.report.read import Stint
from trainserve.rollout.report.words import numbered

COLOURS = {analysis.PASS: "tab:green", analysis.FAIL: "tab:red", analysis.UNKNOWN: "tab:orange"}


def has_bounds(stint: Stint, name: str) -> bool:
    """Whether any look of the stint recorded the check's numbers (a plot has something to show)."""
    return any(numbered(c) for look in stint.looks for c in look.checks if c.name == name)


def draw_bounds(stint: Stint, name: str, out) -> None:
    """The PNG of check `name`'s bounds over the stint's looks, written to the file-like `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    seen = [(look.number, c) for look in stint.looks for c in look.checks if c.name == name and numbered(c)]
    looks = [n for n, _ in seen]
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.fill_between(looks, [c.low for _, c in seen], [c.high for _, c in seen], alpha=0.25, step="mid", label="bounds")
    ax.plot(
        looks, [c.budget for _, c in seen], color="black", linestyle="--", label=f"budget {seen[-1][1].budget:+.4f}"
    )
    for result, colour in COLOURS.items():
        mine = [(n, c) for n, c in seen if c.result == result]
        if mine:
            xs, lows, highs = [n for n, _ in mine], [c.low for _, c in mine], [c.high for _, c in mine]
            ax.vlines(xs, lows, highs, colour, linewidth=3, label=result)
            ax.plot(xs + xs, lows + highs, "_", color=colour, markersize=12)
    ax.set_ylim(*_view([c.low for _, c in seen], seen[-1][1].budget))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("look")
    ax.set_ylabel(f"{name} (bounds)")
    ax.set_title(f"step {stint.index + 1} ({stint.words}): {name}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(out, format="png", dpi=90)
    plt.close(fig)  # pyplot keeps every open figure alive otherwise


def _view(lows: list[float], budget: float) -> tuple[float, float]:
    """The bounds' axis around the budget: up to 3x it or the highest lower bound, whichever is above, and as far
    below; the first looks' wide bounds (up to [-1, 1]) are cut there, so that later ones stay visible beside it."""
    top = 1.15 * max(3 * abs(budget), max(lows), 1e-4)
    bottom = max(min(lows), -top)
    return min(bottom, 0.0) - 0.05 * top, top
