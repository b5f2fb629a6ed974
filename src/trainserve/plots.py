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
