"""`trainserve live-eval --state`: daily runs over a growing capture and a cumulative labels file, as a CronJob
runs them, form one watch of the version `stable` names. A drop is shown on the day its bounds leave the margin and
not before; a retried run, a missed day, a stale or foreign state file, a run killed while writing each leave every
label counted once; --on-drop rollback moves `stable` back with `trainserve rollback`'s code, on the record."""

from __future__ import annotations

import csv
import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from captures import capture_name, prediction_log, write_capture
from trainserve.cli import main
from trainserve.live.labels import example_key
from trainserve.live.report import validate_report
from trainserve.live.sequential import Baseline, Counts, Pace, change_bounds, runs_to_show, verdict
from trainserve.live.state import WatchState, read_state, write_state
from trainserve.live.watch import rate_said
from trainserve.rollout.config_file import find_model, history_path, new_config, read_config, write_config
from trainserve.rollout.history import append_history, read_history
from trainserve.rollout.labels import Rollout, apply_rollout

pytestmark = pytest.mark.unit
DAY, T0 = 86400, 1_790_000_000 // 86400 * 86400
PER_DAY, CLASSES = 120, 3
# Version 2's share right on each day after its promotion: as promoted (0.9) for two days, then 20 points lower.
DAILY_ACCURACY = (0.9, 0.9, 0.7, 0.7, 0.7, 0.7)


class Served:
    """A serving config with version 2 stable (1 kept as previous), promoted on an eval report of 0.9 accuracy on
    `held_out` examples; a capture directory that grows by one file a day, and the labels file of every day so far."""

    def __init__(self, root: Path, held_out: int | None = 1000):
        self.root, self.config, self.captures = root, root / "models.config", root / "captures"
        self.labels, self.state = root / "labels.csv", root / "live" / "state.npz"
        served = new_config("m", str(root / "models"))
        apply_rollout(find_model(served, self.config, "m"), Rollout(stable=2, previous=1))
        write_config(self.config, served)
        report = root / "eval.json"
        report.write_text(json.dumps({"data": {"examples": held_out or 1}, "metrics": {"accuracy": 0.9}}))
        sha = hashlib.sha256(report.read_bytes()).hexdigest()
        if held_out is None:
            report.unlink()  # the report gone: its accuracy is taken as exact
        self.promote(2, 1, report, sha)
        self.rows: list[list] = []

    def promote(self, stable: int, previous: int, report: Path, sha: str) -> None:
        append_history(
            history_path(self.config),
            {
                "action": "promote",
                "model": "m",
                "before": {"stable": previous},
                "after": {"stable": stable, "previous": previous},
                "accuracy": 0.9,
                "report": str(report),
                "report_sha256": sha,
            },
        )

    def day(self, d: int, accuracy: float, version: int = 2, shadow: int | None = None) -> None:
        """Day `d`'s answers by `version` (and `previous` shadowed), each labelled; added to the labels file."""
        rng = np.random.default_rng(d)
        truth = rng.integers(CLASSES, size=PER_DAY)
        right = np.arange(PER_DAY) < round(accuracy * PER_DAY)
        records = []
        for i in range(PER_DAY):
            rid = f"d{d}-{i:04d}"
            for v, ok in ((version, right[i]), *(((shadow, i % 2 == 0),) if shadow else ())):
                answer = truth[i] if ok else (truth[i] + 1) % CLASSES
                scores = np.eye(CLASSES, dtype=np.float32)[[answer]] * 0.8 + 0.2 / CLASSES
                records.append(
                    prediction_log(
                        "m",
                        {"x": np.zeros((1, 1), np.float32)},
                        version=v,
                        request_id=rid,
                        timestamp_s=T0 + d * DAY + i,
                        outputs={"probabilities": scores},
                    )
                )
            self.rows.append([rid, 0, int(truth[i])])
        write_capture(self.captures / capture_name(d), records)
        with open(self.labels, "w", newline="") as out:
            csv.writer(out).writerows([["request_id", "request_row", "label"], *self.rows])

    def run(self, *extra: str, report: bool = False) -> tuple[int, dict | None]:
        """One daily run: (its exit status, what the watch said: the report's section with `report`, else read back
        from the state; None when it could not run). Without a report no page is drawn: the run stays quick."""
        path = self.root / "live" / "live.json"
        path.unlink(missing_ok=True)
        before = self.state.read_bytes() if self.state.exists() else None
        flags = ["--report", str(path)] if report else []
        watch = ["--max-drop", "0.02", "--state", str(self.state), "--config", str(self.config)]
        scored = [str(self.captures), "--labels", str(self.labels), "--model", "m", "--data-dir", str(self.root)]
        code = main(["live-eval", *scored, *watch, *flags, *extra])
        if report and path.exists():
            return code, json.loads(path.read_text())
        if code == 2 or self.state.read_bytes() == before:
            return code, None
        state = read_state(self.state)
        last = state.runs[-1]
        return code, {
            "verdict": last["verdict"],
            "bounds": last["bounds"],
            "run": {"counted": last["counted"], "already_counted": last["already_counted"]},
            "counts": vars(state.counts),
            "version": state.version,
            "baseline": state.baseline.to_json(),
            "rollback": state.acted,
        }


def test_a_drop_is_shown_on_the_day_its_bounds_leave_the_margin_and_not_before(tmp_path, capsys):
    served = Served(tmp_path, held_out=None)
    verdicts, codes = [], []
    for d, accuracy in enumerate(DAILY_ACCURACY):
        served.day(d, accuracy)
        code, section = served.run()
        verdicts.append(section["verdict"])
        codes.append(code)
    shown = verdicts.index("drop shown")
    assert shown == 3 and codes[:shown] == [0] * shown and codes[shown] == 1, verdicts
    assert "drop shown" not in verdicts[:shown]
    assert section["counts"]["examples"] == PER_DAY * len(DAILY_ACCURACY)
    assert "shows within about" in capsys.readouterr().out
    assert Rollout.of(find_model(read_config(served.config), served.config, "m")).stable == 2  # page: nothing moved


def test_a_retried_run_on_the_same_day_counts_nothing_again(tmp_path):
    served = Served(tmp_path)
    served.day(0, 0.9)
    _, first = served.run()
    _, again = served.run()
    assert again["run"] == {"counted": 0, "already_counted": PER_DAY}
    assert again["counts"] == first["counts"] and again["bounds"] == first["bounds"]


def test_a_missed_day_counts_both_days_once(tmp_path):
    daily, missed = Served(tmp_path / "daily"), Served(tmp_path / "missed")
    for served in (daily, missed):
        for d in range(3):
            served.day(d, DAILY_ACCURACY[d])
            if served is daily or d != 1:
                _, section = served.run()
        assert section["counts"]["examples"] == 3 * PER_DAY
    assert read_state(daily.state).counts == read_state(missed.state).counts


def test_a_state_of_another_version_starts_anew_and_says_so(tmp_path, capsys):
    served = Served(tmp_path)
    served.day(0, 0.9)
    served.run()
    served.promote(3, 2, Path("gone.json"), "0" * 64)
    cfg = read_config(served.config)
    apply_rollout(find_model(cfg, served.config, "m"), Rollout(stable=3, previous=2))
    write_config(served.config, cfg)
    served.day(1, 0.9, version=3)
    _, section = served.run()
    assert section["version"] == 3 and section["counts"]["examples"] == PER_DAY
    said = capsys.readouterr().err
    assert "held version 2" in said and "starts anew" in said


def test_a_state_begun_with_another_margin_or_model_is_refused(tmp_path, capsys):
    served = Served(tmp_path)
    served.day(0, 0.9)
    served.run()
    before = served.state.read_bytes()
    assert served.run("--max-drop", "0.05") == (2, None)
    assert "began with --max-drop 0.02" in capsys.readouterr().err
    assert served.run("--model", "other") == (2, None)
    assert served.state.read_bytes() == before


def test_a_run_killed_while_writing_leaves_the_last_state_whole(tmp_path, monkeypatch):
    served = Served(tmp_path)
    served.day(0, 0.9)
    served.run()
    before = served.state.read_bytes()
    served.day(1, 0.9)

    def killed(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr("trainserve.files.os.replace", killed)
    assert served.run()[0] == 130  # interrupted at the rename
    assert served.state.read_bytes() == before and read_state(served.state).counts.examples == PER_DAY
    assert not [p for p in served.state.parent.iterdir() if p.name.startswith(".state.npz.tmp")]


def test_a_file_that_is_no_state_is_one_line(tmp_path, capsys):
    served = Served(tmp_path)
    served.day(0, 0.9)
    served.state.parent.mkdir(parents=True)
    served.state.write_bytes(b"half a file")
    assert served.run() == (2, None)
    assert "not a live-eval state" in capsys.readouterr().err


def test_on_drop_rollback_moves_stable_back_on_the_record(tmp_path, capsys):
    served = Served(tmp_path, held_out=None)
    for d, accuracy in enumerate(DAILY_ACCURACY[:4]):
        served.day(d, accuracy)
        code, section = served.run("--on-drop", "rollback")
    assert code == 1 and section["rollback"]["done"], section
    assert Rollout.of(find_model(read_config(served.config), served.config, "m")).stable == 1
    last = read_history(history_path(served.config))[-1]
    assert last["action"] == "rollback" and last["reason"].startswith("live-eval --on-drop rollback: version 2")
    assert "rolled back" in capsys.readouterr().err


def test_paired_against_previous_counts_the_examples_both_answered(tmp_path):
    served = Served(tmp_path)
    served.day(0, 0.9, shadow=1)
    code, report = served.run("--watch-against", "previous", report=True)
    validate_report(report)
    section = report["watch"]
    assert code == 0 and section["verdict"] == "within the margin" and section["run"]["counted"] == PER_DAY
    c = section["counts"]
    assert section["baseline"]["version"] == 1 and c["examples"] == PER_DAY
    assert c["only"] - c["baseline_only"] == c["correct"] - PER_DAY // 2  # version 1 is right on the even half


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 59), max_size=30), max_size=8))
def test_labels_read_in_any_runs_are_counted_once(runs):
    """However the labelled examples arrive over runs (repeated, overlapping, all at once), the counts are those of
    each example once."""
    keys = np.array([example_key(f"r{i}", 0) for i in range(60)], np.uint64)
    right = np.arange(60) % 3 != 0
    state = WatchState("m", 2, "t", Baseline("held-out", 0.9), 0.02, 0.95)
    for arrived in runs:
        answered = np.full(60, -1, np.int8)
        answered[arrived] = right[arrived]
        state.count(keys, answered, None)
    seen = sorted({i for arrived in runs for i in arrived})
    assert state.counts == Counts(len(seen), int(right[seen].sum()))


def test_the_state_reads_back_as_written(tmp_path):
    state = WatchState("m", 2, "t", Baseline("held-out", 0.9, 900, 1000, "r"), 0.02, 0.95, Counts(5, 4))
    state.keys = np.array([3, 9], np.uint64)
    write_state(tmp_path / "s.npz", state)
    back = read_state(tmp_path / "s.npz")
    assert back.meta() == state.meta() and back.keys.tolist() == [3, 9]


def test_the_runs_stated_are_the_first_whose_slow_case_shows_the_drop():
    baseline = Baseline("held-out", 0.95, 9500, 10000)
    runs = runs_to_show(Pace(0, 0, 300), baseline, 0.02, 0.025)
    assert 10 < runs < 40

    def shown(k: int) -> bool:
        p = 0.90
        n = 300 * k
        right = round(n * (p + 1.6449 * math.sqrt(p * (1 - p) / n + 0.95 * 0.05 / 10000)))
        return verdict(change_bounds(Counts(n, right), baseline, 0.025), 0.02) == "drop shown"

    assert shown(runs) and not shown(runs - 1)
    assert runs_to_show(Pace(0, 0, 900), baseline, 0.02, 0.025) < runs  # more labels a day, fewer runs
    assert runs_to_show(Pace(3, 300, 300), baseline, 0.02, 0.025) == runs + 2  # labels late: 300 in 3 nights


def test_a_held_out_split_too_small_for_the_margin_is_told_so():
    baseline = Baseline("held-out", 0.9, 90, 100)  # its own interval is wider than the drop
    assert runs_to_show(Pace(0, 0, 1000), baseline, 0.02, 0.025) is None
    assert "would not show within two years" in rate_said(1000, None, 0.02)
