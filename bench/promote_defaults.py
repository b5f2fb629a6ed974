"""Can the default rollout gate be passed, and does it still stop a real drop? The margin behind `make promote`,
compose's promote profile and the Kubernetes promote Job (MAX_DROP), measured on the bundled demo.

The demo's model (the default CNN on digits, the demo's epochs and learning rate) is trained once as `stable`
(seed 0) and again with initialisation seeds 1..N on the same training rows and judged on the same held-out rows:
`trainserve train`'s hashed split of digits, which --seed does not move. Each retrain is one candidate; each
retrain with a planted 5-point drop (5 % of the held-out examples it gets right, drawn with its seed, answered
with another class) is another. Every candidate is gated as eval gates it: the paired interval of the accuracy change
(trainserve.evaluation.comparison.paired_metric) against each margin (noninferiority.margin_gate). Prints, per
margin, how many retrains pass and how many planted drops pass, the observed discordance, and the pre-flight's
smallest decidable margin. Target for the default: >= 8 of 10 retrains pass, 0 of 10 planted drops.

    python bench/promote_defaults.py [--seeds 10] [--epochs 20] [--margins 0.01,0.02,0.03,0.04]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from trainserve.evaluation.comparison import paired_metric  # noqa: E402
from trainserve.evaluation.noninferiority import Margin, margin_gate  # noqa: E402
from trainserve.evaluation.preflight import decidable_margin  # noqa: E402
from trainserve.sources.builtin import digits  # noqa: E402

PLANTED_DROP = 0.05


def train_predictions(seed: int, epochs: int, dataset) -> np.ndarray:
    """The demo's model trained with initialisation seed `seed` on the fixed training rows: its held-out classes."""
    import keras

    from trainserve.training.config import TrainConfig
    from trainserve.training.model import build_for_training
    from trainserve.training.model_fn import data_spec

    keras.utils.set_random_seed(seed)
    defaults = TrainConfig()
    spec = data_spec(dataset.train, dataset.task)
    model = build_for_training("cnn", spec, defaults.learning_rate)
    x, y = dataset.train["images"], dataset.y_train
    fit = {"epochs": epochs, "batch_size": defaults.batch_size, "validation_split": defaults.validation_split}
    model.fit(x, y, shuffle=True, verbose=0, **fit)  # as training: the last tenth held back for validation
    return model.predict(dataset.test["images"], verbose=0).argmax(axis=1)


def planted(predicted: np.ndarray, truth: np.ndarray, seed: int, classes: int = 10) -> np.ndarray:
    """`predicted` with PLANTED_DROP of all examples, drawn among those it gets right, answered wrongly."""
    rng = np.random.default_rng(1000 + seed)
    right = np.flatnonzero(predicted == truth)
    spoiled = rng.choice(right, size=round(PLANTED_DROP * len(truth)), replace=False)
    worse = predicted.copy()
    worse[spoiled] = (truth[spoiled] + rng.integers(1, classes, len(spoiled))) % classes
    return worse


def gate(candidate: np.ndarray, stable: np.ndarray, truth: np.ndarray, drop: float) -> dict:
    """The non-inferiority gate eval applies, on these answers."""
    metric = paired_metric("accuracy", (candidate == truth) * 1.0, (stable == truth) * 1.0, 0.05, 0)
    comparison = {"metrics": {"accuracy": metric}, "baseline": {"version": 1}, "level": 0.95}
    return margin_gate(Margin("accuracy", drop), comparison)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=20, help="the demo's epochs (.env EPOCHS)")
    parser.add_argument("--margins", default="0.01,0.015,0.02,0.025,0.03,0.04")
    args = parser.parse_args()
    margins = [float(m) for m in args.margins.split(",")]
    from trainserve.training.config import TrainConfig

    # The demo's own hashed split (its salt comes from the model name): the same rows for every seed.
    dataset = digits(0, TrainConfig(model_name="digits").held_out_split)
    truth = dataset.y_test
    started = time.perf_counter()
    stable = train_predictions(0, args.epochs, dataset)
    retrains, discordance = [], []
    for seed in range(1, args.seeds + 1):
        retrains.append(train_predictions(seed, args.epochs, dataset))
        discordance.append(float(np.mean((retrains[-1] == truth) != (stable == truth))))
        print(
            f"seed {seed}: accuracy {np.mean(retrains[-1] == truth):.4f} vs stable {np.mean(stable == truth):.4f}, "
            f"discordance {discordance[-1]:.4f}",
            flush=True,
        )
    drops = [planted(p, truth, seed) for seed, p in enumerate(retrains, start=1)]
    n = len(truth)
    print(f"\n{n} held-out examples, {args.seeds} seeds, {args.epochs} epochs, {time.perf_counter() - started:.0f} s")
    share = float(np.median(discordance))
    print(
        f"discordance of a retrain: median {share:.4f} (min {min(discordance):.4f}, max {max(discordance):.4f}); "
        f"smallest margin decidable with 80% power at the median: {decidable_margin(n, share):.4f}"
    )
    lowest = min(gate(p, stable, truth, 0.0)["value"] for p in retrains)
    highest = max(gate(p, stable, truth, 0.0)["value"] for p in drops)
    print(f"lower end of the change's interval: retrains from {lowest:+.4f}, planted drops up to {highest:+.4f}")
    print(f"{'margin':>8} {'retrains pass':>14} {'planted -5 pts pass':>20}")
    for drop in margins:
        passed = sum(gate(p, stable, truth, drop)["passed"] for p in retrains)
        spoiled = sum(gate(p, stable, truth, drop)["passed"] for p in drops)
        print(f"{drop:>8g} {passed:>9} of {len(retrains):<2} {spoiled:>15} of {len(drops):<2}")


if __name__ == "__main__":
    main()
