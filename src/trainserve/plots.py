"""PNG plots a person would rather look at than read: training curves (and, later, eval plots)."""

from __future__ import annotations

import csv
from pathlib import Path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_training_curves(history_csv: Path, out: Path) -> Path:
    """Loss and accuracy per epoch, train vs held-out, from Keras' CSVLogger file."""
    with open(history_csv, newline="") as fh:
        rows = list(csv.DictReader(fh))
    plt = _pyplot()
    epochs = [int(r["epoch"]) + 1 for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, metric in zip(axes, ("loss", "accuracy")):
        for key, label in ((metric, "train"), (f"val_{metric}", "held-out")):
            if rows and key in rows[0]:
                ax.plot(epochs, [float(r[key]) for r in rows], marker="o", label=label)
        ax.set_xlabel("epoch")
        ax.set_title(metric)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


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
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


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
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
