"""The watch's state (`--state FILE`): what earlier runs of `live-eval` counted of the version `stable` names, so
that its daily runs form one test (trainserve.live.sequential) and no label is counted twice.

The file holds the counts, the baseline fixed at the first run, the settings the test began with, one line per
run, and the 64-bit key (trainserve.live.labels.example_key) of every example counted, sorted (8 bytes an
example): a retried Job, a run whose window overlaps the last one, or a cumulative labels file read again finds
its examples already counted and adds nothing; two days' labels after a missed day are each counted once.

It is one NumPy .npz (the settings as JSON beside the keys), replaced atomically (trainserve.files): a run killed
while writing leaves the last state whole. A state of another version, or of an earlier promotion of this one,
starts anew, and says so; one of another model, or begun with another margin, level or baseline design, is
refused: its counts answer another question.
"""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trainserve.errors import TrainserveError
from trainserve.files import write_file_atomic
from trainserve.live.sequential import Baseline, Counts

STATE_SCHEMA = "trainserve.live-eval-state/1"
NOT_ANSWERED = -1


@dataclass
class WatchState:
    """One version's watch: `promoted` is the time of the promotion it follows (a new one starts anew)."""

    model: str
    version: int
    promoted: str
    baseline: Baseline
    margin: float
    level: float
    counts: Counts = field(default_factory=Counts)
    keys: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    runs: list[dict] = field(default_factory=list)
    acted: dict | None = None  # the rollback done on a drop shown: a retried run does not act twice

    def meta(self) -> dict:
        return {
            "schema": STATE_SCHEMA,
            "model": self.model,
            "version": self.version,
            "promoted": self.promoted,
            "baseline": self.baseline.to_json(),
            "margin": self.margin,
            "level": self.level,
            "counts": vars(self.counts),
            "runs": self.runs,
            "acted": self.acted,
        }

    def count(self, keys: np.ndarray, answered: np.ndarray, baseline_answered: np.ndarray | None) -> dict:
        """Add the examples among `keys` (the labels' keys) that the version answered (`answered`: -1 not, 0 wrong,
        1 right per label; paired, `previous`'s too) and no earlier run counted. Returns what this run added."""
        eligible = answered != NOT_ANSWERED
        if baseline_answered is not None:
            eligible &= baseline_answered != NOT_ANSWERED
        seen = np.isin(keys, self.keys) & eligible
        new = eligible & ~seen
        right = answered[new] == 1
        added = Counts(int(new.sum()), int(right.sum()))
        if baseline_answered is not None:
            other = baseline_answered[new] == 1
            added.only, added.baseline_only = int(np.sum(right & ~other)), int(np.sum(~right & other))
        self.counts.add(added)
        self.keys = np.union1d(self.keys, keys[new].astype(np.uint64))
        return {"counted": added.examples, "already_counted": int(seen.sum())}


def read_state(path: Path) -> WatchState | None:
    """The state at `path`; None when there is none yet. One error line for a file that is not one."""
    if not path.exists():
        return None
    try:
        with np.load(io.BytesIO(path.read_bytes()), allow_pickle=False) as held:
            meta, keys = json.loads(held["meta"].tobytes()), held["keys"].astype(np.uint64)
        if meta.get("schema") != STATE_SCHEMA:
            raise ValueError(f"schema {meta.get('schema')!r}")
        return WatchState(
            meta["model"],
            meta["version"],
            meta["promoted"],
            Baseline.from_json(meta["baseline"]),
            meta["margin"],
            meta["level"],
            Counts(**meta["counts"]),
            keys,
            meta["runs"],
            meta["acted"],
        )
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as exc:
        raise TrainserveError(
            f"--state {path}: not a live-eval state ({exc}): expected the file an earlier run wrote, or a new path"
        ) from None


def write_state(path: Path, state: WatchState) -> None:
    """Replace `path` atomically: a reader, or the next run, sees the last state whole."""
    buffer = io.BytesIO()
    meta = np.frombuffer(json.dumps(state.meta(), allow_nan=False).encode(), np.uint8)
    np.savez(buffer, meta=meta, keys=state.keys.astype(np.uint64))
    write_file_atomic(path, buffer.getvalue())


def continued(path: Path, fresh: WatchState) -> tuple[WatchState, str | None]:
    """The state to go on with: the one at `path` when it watches `fresh`'s version and promotion with its settings;
    else `fresh`, with the words saying why it starts anew (None: the first run)."""
    held = read_state(path)
    if held is None:
        return fresh, None
    if held.model != fresh.model:
        raise TrainserveError(
            f"--state {path}: holds model {held.model!r}'s watch: expected a state of model {fresh.model!r} "
            "(one state file per model)"
        )
    if (held.version, held.promoted) != (fresh.version, fresh.promoted):
        which = "an earlier promotion of it" if held.version == fresh.version else f"version {held.version}"
        return fresh, (
            f"--state {path} held {which} (promoted {held.promoted}, {held.counts.examples} labelled examples): "
            f"version {fresh.version} promoted {fresh.promoted} is stable now: its count starts anew"
        )
    began = (held.margin, held.level, held.baseline.design)
    if began != (fresh.margin, fresh.level, fresh.baseline.design):
        raise TrainserveError(
            f"--state {path}: version {held.version}'s count began with --max-drop {held.margin:g}, --level "
            f"{held.level:g}, --watch-against {held.baseline.design}: expected the same (changing them after looking "
            "breaks the test's error rate), or a new --state"
        )
    return held, None
