"""PNG plots a person would rather look at than read: training curves, and the evaluation's plots."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, out: Path) -> Path:
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)  # pyplot keeps every open figure alive otherwise
    return out


def _label(ax, x: str, y: str, title: str) -> None:
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title(title)
    ax.grid(alpha=0.3)


def plot_training_curves(history_csv: Path, out: Path) -> Path:
    """Loss and the task's metric per epoch, train vs validation, from Keras' CSVLogger file."""
    with open(history_csv, newline="") as fh:
        rows = list(csv.DictReader(fh))
    plt = _pyplot()
    epochs = [int(r["epoch"]) + 1 for r in rows]
    # The loss beside the task's metric: accuracy for classification, MAE for regression, or a user's own.
    own = [c for c in (rows[0] if rows else ()) if c not in ("epoch", "loss", "learning_rate") and c[:4] != "val_"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, metric in zip(axes, ("loss", own[0] if own else "accuracy")):
        for key, label in ((metric, "train"), (f"val_{metric}", "validation")):
            # Keras' CSVLogger writes NA in the val_ columns of a training without validation data
            points = [(epoch, float(r[key])) for epoch, r in zip(epochs, rows) if r.get(key) not in (None, "", "NA")]
            if points:
                ax.plot(*zip(*points), marker="o", label=label)
        ax.set_xlabel("epoch")
        ax.set_title(metric)
        ax.grid(alpha=0.3)
        ax.legend()
    return _save(plt, fig, out)


def plot_confusion_matrix(confusion, labels: list[str], out: Path, title: str) -> Path:
    """Heatmap of counts, truth down the side, prediction along the top; counts written in each cell."""
    plt = _pyplot()
    k = len(confusion)
    size = min(12, 3 + 0.5 * k)
    fig, ax = plt.subplots(figsize=(size, size))
    image = ax.imshow(confusion, cmap="Blues")
    fig.colorbar(image, ax=ax, fraction=0.046)
    if k <= 30:
        ax.set_xticks(range(k), labels, rotation=90 if max(map(len, labels)) > 3 else 0)
        ax.set_yticks(range(k), labels)
        peak = confusion.max() or 1
        for i in range(k):
            for j in range(k):
                if confusion[i, j]:
                    color = "white" if confusion[i, j] > peak / 2 else "black"
                    ax.text(j, i, str(confusion[i, j]), ha="center", va="center", fontsize=8, color=color)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title)
    return _save(plt, fig, out)


def plot_latency_histogram(latencies_ms: list[float], summary: dict, out: Path) -> Path:
    """Per-request latency distribution with p50/p90/p99 marked."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.hist(latencies_ms or [0.0], bins=min(50, max(5, len(latencies_ms) // 4)), color="tab:blue", alpha=0.8)
    for name, style in (("p50", "-"), ("p90", "--"), ("p99", ":")):
        ax.axvline(summary[name], color="tab:red", linestyle=style, label=f"{name} {summary[name]:.1f} ms")
    ax.set_xlabel("latency per request (ms)")
    ax.set_ylabel("requests")
    ax.legend()
    ax.grid(alpha=0.3)
    return _save(plt, fig, out)


def plot_precision_recall(precision, recall, out: Path, title: str) -> Path:
    """Precision against recall over every threshold (two classes), as a step curve."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.step([0.0, *recall], [precision[0] if len(precision) else 1.0, *precision], where="post")
    ax.set_xlim(0, 1.02)
    ax.set_ylim(0, 1.02)
    _label(ax, "recall", "precision", title)
    return _save(plt, fig, out)


MAX_SCATTER_POINTS = 20_000  # a scatter of a million points shows no more and takes minutes to draw


def plot_predicted_vs_true(truth, predicted, out: Path, title: str) -> Path:
    """One point per example and target (an evenly spaced subset of big runs); the diagonal is perfect."""
    plt = _pyplot()
    step = max(1, len(truth) // MAX_SCATTER_POINTS)
    fig, ax = plt.subplots(figsize=(5, 5))
    for t in range(truth.shape[1]):
        ax.scatter(truth[::step, t], predicted[::step, t], s=6, alpha=0.5, label=f"target {t}")
    low = float(min(truth.min(initial=0), predicted.min(initial=0)))
    high = float(max(truth.max(initial=1), predicted.max(initial=1)))
    ax.plot([low, high], [low, high], color="black", linewidth=1)
    _label(ax, "true", "predicted", title)
    if truth.shape[1] > 1:
        ax.legend()
    return _save(plt, fig, out)


def plot_residuals(truth, predicted, out: Path, title: str) -> Path:
    """Histogram of predicted - true over every example and target: centred on 0 when unbiased."""
    plt = _pyplot()
    residuals = (predicted - truth).ravel()
    fig, ax = plt.subplots(figsize=(8, 4))
    residuals = residuals if residuals.size else np.zeros(1)
    # Near-equal residuals (an exact model, float rounding) cannot be split into many finite bins.
    spread = float(np.ptp(residuals)) > 1e-9 * max(1.0, float(np.abs(residuals).max()))
    ax.hist(residuals, bins=min(60, max(5, residuals.size // 10)) if spread else 1, alpha=0.8)
    ax.axvline(0.0, color="black", linewidth=1)
    _label(ax, "residual (predicted - true)", "examples", title)
    return _save(plt, fig, out)


def plot_throughput_vs_latency(points: list[dict], out: Path, title: str, budget_ms: float | None = None) -> Path:
    """`trainserve load`: p99 against examples/s, one line per batch size and loop (closed: C workers, open:
    R requests/s), each point labelled; hollow markers are unstable points; the budget as a dashed line."""
    plt = _pyplot()
    from matplotlib import ticker

    fig, ax = plt.subplots(figsize=(8, 5))
    series: dict[tuple[str, int], list[dict]] = {}
    for p in points:
        if p["latency_ms"]:
            series.setdefault((p["mode"], p["batch_size"]), []).append(p)
    batches = sorted({batch for _, batch in series})
    for (mode, batch), members in sorted(series.items()):
        loop = "closed" if mode == "concurrency" else "open"
        xs, ys = [p["examples_per_s"] for p in members], [p["latency_ms"]["p99"] for p in members]
        color = f"C{batches.index(batch) % 10}"  # one colour per batch size; the loop is the line style
        (line,) = ax.plot(
            xs, ys, color=color, linestyle="-" if loop == "closed" else "--", label=f"batch {batch}, {loop} loop"
        )
        for p, x, y in zip(members, xs, ys):
            face = line.get_color() if p["stable"] else "none"
            ax.plot([x], [y], marker="o", markerfacecolor=face, markeredgecolor=line.get_color())
            tag = f"C{p['concurrency']}" if mode == "concurrency" else f"R{p['rate']:g}"
            ax.annotate(tag, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    if budget_ms is not None:
        ax.axhline(budget_ms, color="tab:red", linestyle=":", label=f"budget {budget_ms:g} ms")
    ax.set_xlabel("throughput (examples/s)")
    ax.set_ylabel("p99 latency (ms)")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "25" else ""))
    ax.set_title(f"{title}: hollow = unstable")
    ax.grid(alpha=0.3, which="both")
    if series or budget_ms is not None:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def plot_histogram(edges, counts, out: Path, title: str, xlabel: str, log_x: bool = False) -> Path:
    """Counts already binned (mergeable reports keep histograms, not values) drawn as bars over their edges."""
    plt = _pyplot()
    edges, counts = np.asarray(edges, np.float64), np.asarray(counts, np.float64)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    if counts.size:
        ax.stairs(counts, edges, fill=True, alpha=0.8)
    if log_x:
        ax.set_xscale("log")
    _label(ax, xlabel, "count", title)
    return _save(plt, fig, out)


def plot_distributions(edges, expected, observed, out: Path, title: str, labels=None, axis: str | None = None) -> Path:
    """Two shares over the same bins (training vs traffic): bars side by side, category names when given; `axis`
    says what the bins are (values, categories)."""
    plt = _pyplot()
    expected, observed = np.asarray(expected, np.float64), np.asarray(observed, np.float64)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    x = np.arange(len(expected))
    ax.bar(x - 0.2, expected, width=0.4, label="training")
    ax.bar(x + 0.2, observed, width=0.4, label="traffic")
    names = labels if labels is not None else [f"{edges[i]:.3g}" for i in range(len(expected))]
    if len(names) <= 30:
        ax.set_xticks(x, [str(n)[:18] for n in names], rotation=45, ha="right", fontsize=9)
    ax.legend()
    _label(ax, axis or ("bin" if labels is None else "category"), "share", title)
    return _save(plt, fig, out)
