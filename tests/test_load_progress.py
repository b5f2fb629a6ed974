"""A load sweep as a person follows it: one line per level as it finishes, readable alone, and on a terminal a
bar over the levels (issue 57: the sweep printed nothing until its end). No server: the levels are made here."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np
import pytest

from trainserve.evaluation.load import sweep
from trainserve.evaluation.load.config import LoadConfig
from trainserve.evaluation.load.measure import Measured, Point, Window
from trainserve.evaluation.load.sweep_progress import SweepProgress

pytestmark = pytest.mark.unit


def level(mode: str = "concurrency", value: float = 4, errors: int = 0, answered: int = 100) -> Point:
    """A level measured in 3 windows of 1 s, each `answered` requests of 1 example at 5 ms."""
    windows = [Window(1.0, np.full(answered, 0.005), answered, {"UNAVAILABLE": errors} if errors else {}, 100)] * 3
    return Point(mode, value, 1, 1.0, Measured(windows, True, None, 0, []), None)


def lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.endswith("sweep_progress")]


def test_each_level_in_one_line_as_it_finishes(caplog):
    caplog.set_level(logging.INFO)
    with SweepProgress(3, show=False) as progress:
        progress.finished(level())
        progress.finished(level("rate", 50.5))
        progress.finished(level(errors=3, answered=0))
    assert lines(caplog) == [
        "load: level 1 of 3: C=4, batch 1: 100.0 requests/s (100.0 examples/s), p50 5.0 ms, p99 5.0 ms, 0 errors, "
        "stable after 3 windows",
        "load: level 2 of 3: R=50.5/s, batch 1: 100.0 requests/s (100.0 examples/s), p50 5.0 ms, p99 5.0 ms, "
        "0 errors, stable after 3 windows",
        "load: level 3 of 3: C=4, batch 1: 0.0 requests/s (0.0 examples/s), no answers, 9 errors, "
        "stable after 3 windows",
    ]


def test_on_a_terminal_a_bar_over_the_levels(capsys):
    with SweepProgress(4, show=True) as progress:
        progress.finished(level())
    bar = capsys.readouterr().err
    assert "load sweep" in bar and "1/4" in bar and "C=4, batch 1" in bar


def test_the_sweep_says_each_level_before_it_measures_the_next(caplog, monkeypatch):
    """run_sweep with its client, inputs and measurements made here: the line of a level comes before the next
    level's measurement, not with the table at the end."""
    caplog.set_level(logging.INFO)
    client = SimpleNamespace(wait_until_available=lambda target, wait: 1, signature=lambda target, version: None)
    client.channel, client.close = SimpleNamespace(unary_unary=lambda method: None), lambda: None
    monkeypatch.setattr(sweep, "ServingClient", lambda *args, **kwargs: client)
    monkeypatch.setattr(sweep, "build_inputs", lambda *args: SimpleNamespace(data_name="synthetic"))
    monkeypatch.setattr(sweep, "build_load_report", lambda *args: {"best": None})
    said_before = []

    def measure_point(config, call, inputs, mode, value, batch_size):
        said_before.append(len(lines(caplog)))
        return level(mode, value)

    monkeypatch.setattr(sweep, "_measure_point", measure_point)
    sweep.run_sweep(LoadConfig(model="m", batch_sizes=(1,), concurrency=(1, 2), rate=(10.0,)))
    assert said_before == [0, 1, 2] and len(lines(caplog)) == 3
