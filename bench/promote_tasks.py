"""The two held-out sets bench/promote_defaults.py judges the default margin on, and the candidates it plants:

- `demo`: the bundled demo, the default CNN on digits with the demo's epochs, judged on its 355 held-out rows
  (training's hashed split of digits, which --seed does not move);
- `large`: a user's own npz with 6,000 held-out rows: a seeded synthetic 10-class task (16 features, Gaussian
  classes of unequal spread) and a small MLP whose retrains land near 0.97 accuracy.

Each version is trained once per initialisation seed on the same training rows, and its held-out answers are
cached on disk (--cache): a second run of the benchmark trains nothing.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

LARGE_TRAIN, LARGE_HELD_OUT, LARGE_FEATURES, CLASSES = 12_000, 6_000, 16, 10


def demo_task(epochs: int):
    """(truth, train(seed) -> held-out classes) for the demo."""
    from trainserve.sources.builtin import digits
    from trainserve.training.config import TrainConfig

    dataset = digits(0, TrainConfig(model_name="digits").held_out_split)  # the demo's own hashed split

    def train(seed: int) -> np.ndarray:
        import keras

        from trainserve.training.model import build_for_training
        from trainserve.training.model_fn import data_spec

        keras.utils.set_random_seed(seed)
        defaults = TrainConfig()
        model = build_for_training("cnn", data_spec(dataset.train, dataset.task), defaults.learning_rate)
        fit = {"epochs": epochs, "batch_size": defaults.batch_size, "validation_split": defaults.validation_split}
        model.fit(dataset.train["images"], dataset.y_train, shuffle=True, verbose=0, **fit)
        return model.predict(dataset.test["images"], verbose=0).argmax(axis=1)

    return dataset.y_test, train


def large_task(epochs: int):
    """(truth, train(seed) -> held-out classes) for the synthetic 6,000-row held-out set."""
    rng = np.random.default_rng(2024)
    centres = rng.normal(0, 1.0, (CLASSES, LARGE_FEATURES))
    spread = rng.uniform(0.65, 1.15, CLASSES)  # some classes harder than others, as in real data

    def draw(rows: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, CLASSES, rows)
        return (centres[y] + rng.normal(0, 1, (rows, LARGE_FEATURES)) * spread[y, None]).astype("float32"), y

    (x_train, y_train), (x_test, y_test) = draw(LARGE_TRAIN), draw(LARGE_HELD_OUT)

    def train(seed: int) -> np.ndarray:
        import keras

        keras.utils.set_random_seed(seed)
        model = keras.Sequential(
            [keras.Input((LARGE_FEATURES,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(CLASSES)]
        )
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        model.compile(optimizer=keras.optimizers.Adam(0.003), loss=loss)
        model.fit(x_train, y_train, epochs=epochs, batch_size=128, shuffle=True, verbose=0)
        return model.predict(x_test, verbose=0, batch_size=2048).argmax(axis=1)

    return y_test, train


TASKS = {"demo": demo_task, "large": large_task}


def answers(task: str, epochs: int, seeds: range, cache: Path) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """The held-out truth and each seed's held-out classes, trained once and then read from `cache`."""
    truth, train = TASKS[task](epochs)
    key = hashlib.sha256(json.dumps([task, epochs, truth.tolist()[:50], len(truth)]).encode()).hexdigest()[:12]
    predicted = {}
    for seed in seeds:
        path = cache / f"{task}-{epochs}e-{key}-seed{seed}.npy"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            np.save(path, train(seed).astype(np.int16))
        predicted[seed] = np.load(path).astype(np.int64)
    return truth, predicted


def planted(predicted: np.ndarray, truth: np.ndarray, share: float, seed: int, within: int | None = None) -> np.ndarray:
    """`predicted` with `share` of all examples, drawn among those it gets right (of class `within` only, when
    given: a drop concentrated in one class), answered with another class."""
    rng = np.random.default_rng(1000 + seed)
    right = np.flatnonzero((predicted == truth) & (truth == within if within is not None else True))
    spoiled = rng.choice(right, size=round(share * len(truth)), replace=False)
    worse = predicted.copy()
    worse[spoiled] = (truth[spoiled] + rng.integers(1, CLASSES, len(spoiled))) % CLASSES
    return worse
