"""Every output shown on docs/deciding-a-rollout.md, regenerated, so the page cannot go stale.

  record OUT_DIR   trains the page's versions with `trainserve train` (digits, a CNN, 15 epochs, on the CPU: a few
                   minutes), runs each on its held-out examples in process, and writes what each version answered
                   per example to docs/examples/rollout-outcomes.npz (needs TensorFlow)
  render           prints each output block of the page from those recorded answers, through the code eval runs
                   (trainserve.evaluation.comparison, noninferiority, slicing, report)
  --check          exits 1 when a block on the page differs from what render prints (tests/test_docs_rollout.py)
  --write          rewrites the page's blocks in place

A block is the fenced code block after a `<!-- output: NAME -->` line. Latency lines are left out of the
rendered tables: they are the only numbers a recorded answer cannot give again.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "deciding-a-rollout.md"
OUTCOMES = REPO / "docs" / "examples" / "rollout-outcomes.npz"
EPOCHS, LOST_SHARE = 15, 0.9  # the planted regression: the candidate's training lost 90 % of the class "3" rows
# case -> (held-out fraction, candidate's training, candidate's seed); the baseline trains on all rows, seed 0
CASES = {
    "seed": (0.2, "all", 1),  # a retrain with another seed
    "lost3": (0.2, "lost3", 0),
    "lost3_half": (0.5, "lost3", 0),
}
_BLOCK = re.compile(r"(<!-- output: (?P<name>[a-z0-9_-]+) -->\n```[a-z]*\n)(?P<body>.*?)(\n```)", re.S)


def _split(test_fraction: float) -> tuple[np.ndarray, ...]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bundled = load_digits()
    images = np.round(bundled.images * (255.0 / 16.0)).astype(np.uint8)  # as trainserve's `digits` scales them
    return tuple(
        train_test_split(images, bundled.target, test_size=test_fraction, random_state=0, stratify=bundled.target)
    )


def _train(npz: Path, models: Path, name: str, seed: int) -> Path:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "trainserve",
            "train",
            "--data",
            str(npz),
            "--model-name",
            name,
            "--epochs",
            str(EPOCHS),
            "--seed",
            str(seed),
            "--export-base",
            str(models),
            "--data-dir",
            str(models.parent / "data"),
            "--logs-dir",
            str(models.parent / "logs"),
        ],
        check=True,
    )
    return max((models / name).iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1)


def _probabilities(version_dir: Path, x: np.ndarray) -> np.ndarray:
    from trainserve.savedmodel import LoadedModel

    model = LoadedModel(version_dir)
    try:
        wanted, _ = model.signature("serving_default")
        (key,) = wanted
        return model.run("serving_default", {key: x[..., None]}, ["probabilities"])["probabilities"].astype(np.float32)
    finally:
        model.close()


def record(out: Path) -> None:
    """Train each case's two versions and store their per-example answers."""
    arrays = {}
    for case, (fraction, training, seed) in CASES.items():
        x_train, x_test, y_train, y_test = _split(fraction)
        answers = []
        for name, rows, version_seed in (("candidate", training, seed), ("baseline", "all", 0)):
            keep = np.ones(len(y_train), bool)
            if rows == "lost3":
                threes = np.flatnonzero(y_train == 3)
                keep[np.random.default_rng(0).choice(threes, round(LOST_SHARE * len(threes)), replace=False)] = False
            npz = out / f"{case}_{name}.npz"
            np.savez(npz, x_train=x_train[keep], y_train=y_train[keep], x_test=x_test, y_test=y_test)
            answers.append(_probabilities(_train(npz, out / "models", f"{case}_{name}", version_seed), x_test))
        arrays |= {
            f"{case}/truth": y_test.astype(np.int64),
            f"{case}/candidate": answers[0],
            f"{case}/baseline": answers[1],
        }
    OUTCOMES.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUTCOMES, **arrays)


def _comparison(case: str, outcomes, **options) -> dict:
    from trainserve.evaluation.comparison import per_example, summarize
    from trainserve.evaluation.metrics import task_metrics
    from trainserve.evaluation.plan import Plan
    from trainserve.evaluation.records import BatchAnswer, Tally
    from trainserve.task import Task

    truth = outcomes[f"{case}/truth"]
    task = Task("classification", classes=10, label_names=tuple(str(c) for c in range(10)))
    plan = Plan((), task, "probabilities")
    tallies = tuple(Tally(plan, task_metrics(task, 5)) for _ in range(2))
    # What eval derives per example from a served answer, from the recorded answers.
    answers = (
        BatchAnswer(0, truth, outcomes[f"{case}/{who}"], None, 0.0, 0, None) for who in ("candidate", "baseline")
    )
    values = tuple(per_example(answer, plan, tally.quality) for answer, tally in zip(answers, tallies))
    versions = (3, 1) if case == "seed" else (2, 1)
    return summarize("1", versions, tallies, values, 0.05, 0, **options)


def _gate_line(comparison: dict, margin: str) -> str:
    from trainserve.evaluation.noninferiority import describe_margin_gate, margin_gate
    from trainserve.margins import parse_margins

    gate = margin_gate(parse_margins(margin)[0], comparison)
    return f"  gate            {describe_margin_gate(gate)}: {'PASS' if gate['passed'] else 'FAIL'}"


def _table(comparison: dict) -> list[str]:
    from trainserve.evaluation.comparison import comparison_lines

    return [line for line in comparison_lines(comparison) if not line.lstrip().startswith("latency ms")]


def render() -> dict[str, str]:
    """Each block's text, by name."""
    from trainserve.evaluation.slicing import slice_lines
    from trainserve.stats.power import examples_to_decide, smallest_decidable_margin

    with np.load(OUTCOMES) as outcomes:
        seed, lost, half = (_comparison(case, outcomes) for case in ("seed", "lost3", "lost3_half"))
        sliced = _comparison("lost3", outcomes, slice_margin=_slice_margin("accuracy=0.05"))
    share = _discordant_share(seed)
    n = seed["metrics"]["accuracy"]["examples"]
    planning = [
        f"examples {n}, discordant share {share:.4f} (right in one version only)",
        f"smallest margin decidable with 80% power: {smallest_decidable_margin(n, share):.4f}",
    ] + [f"examples needed for a margin of {m:g}: {examples_to_decide(m, share):,}" for m in (0.01, 0.02, 0.03)]
    return {
        "seed": "\n".join([seed["verdict_line"], _gate_line(seed, "accuracy=0.01")]),
        "seed-wider": _gate_line(seed, "accuracy=0.03"),
        "lost3": "\n".join([lost["verdict_line"], _gate_line(lost, "accuracy=0.01")]),
        "lost3-half": "\n".join([half["verdict_line"], _gate_line(half, "accuracy=0.01")]),
        "planning": "\n".join(planning),
        "slices": "\n".join(slice_lines(half["slices"])),
        "gate-slices": _gate_slices(half),
        "slice-gate": _slice_gate_line(sliced),
        "table": "\n".join(_table(lost)),
    }


def _slice_margin(text: str):
    from trainserve.evaluation.slicing import parse_slice_margin

    return parse_slice_margin(text)


def _slice_gate_line(comparison: dict) -> str:
    from trainserve.evaluation.slicing import slice_margin_gate

    gate = slice_margin_gate(comparison["slices"], comparison["baseline"]["version"])
    return f"  gate            {gate['said']}: {'PASS' if gate['passed'] else 'FAIL'}"


def _gate_slices(comparison: dict) -> str:
    """What `eval --gate-slices` prints when a slice is significantly worse (evaluation.commands' line)."""
    from trainserve.evaluation.slicing import slice_gate

    gate = slice_gate(comparison["slices"], comparison["baseline"]["version"])
    command = "$ trainserve eval ... --compare-with stable --gate-slices"
    return f"{command}\ntrainserve eval: gate {'passed' if gate['passed'] else 'failed: ' + gate['said']}"


def _discordant_share(comparison: dict) -> float:
    d = comparison["test"]["discordant"]
    return (d["candidate_only"] + d["baseline_only"]) / comparison["metrics"]["accuracy"]["examples"]


def differences(page: str, blocks: dict[str, str]) -> list[str]:
    """The names of the page's blocks that differ from `blocks`, and of blocks the page lacks."""
    shown = {m["name"]: m["body"] for m in _BLOCK.finditer(page)}
    return [name for name in blocks if shown.get(name) != blocks[name]] + [n for n in shown if n not in blocks]


def rewritten(page: str, blocks: dict[str, str]) -> str:
    return _BLOCK.sub(lambda m: m[1] + blocks.get(m["name"], m["body"]) + m[4], page)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["record", "render"])
    parser.add_argument("out", nargs="?", type=Path, help="record: a scratch directory for the trainings")
    parser.add_argument("--check", action="store_true", help="render: exit 1 when the page differs")
    parser.add_argument("--write", action="store_true", help="render: rewrite the page's blocks")
    args = parser.parse_args(argv)
    if args.command == "record":
        with tempfile.TemporaryDirectory() as scratch:
            record(args.out or Path(scratch))
        return 0
    blocks = render()
    page = PAGE.read_text()
    if args.write:
        PAGE.write_text(rewritten(page, blocks))
    elif args.check:
        stale = differences(page, blocks)
        if stale:
            print(
                f"{PAGE.name}: blocks differ from what the recorded answers give: {', '.join(stale)}", file=sys.stderr
            )
            return 1
    else:
        for name, text in blocks.items():
            print(f"<!-- output: {name} -->\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
