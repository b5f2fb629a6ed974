"""A version's load as a person follows it (`trainserve candidate`, a promote or a rollout step waiting on the
server): what it waits for, each state the server reports, the wait going on, the time the load took, and on a
terminal a bar (issue 57: candidate printed nothing for the 17 s of a load)."""

from __future__ import annotations

import logging
import re

import pytest

from trainserve.client import load_watch, status
from trainserve.client.load_watch import LoadWatch
from trainserve.client.status import ModelStatus
from trainserve.errors import TrainserveError
from trainserve.protos import get_model_status_pb2

pytestmark = pytest.mark.unit
State = get_model_status_pb2.ModelVersionStatus.State


class Clock:
    def __init__(self, *times: float):
        self.times = list(times)

    def __call__(self) -> float:
        return self.times.pop(0)


def said(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == load_watch.__name__]


def test_each_new_state_once_the_same_again_after_a_while_and_the_time_the_load_took(caplog):
    caplog.set_level(logging.INFO)
    watch = LoadWatch("model m version 3", "h:8500", 600, clock=Clock(0, 0.2, 1, 2, 2 + load_watch.REPEAT_S, 17, 17.2))
    for version, state in [(None, "UNAVAILABLE"), (None, "state LOADING"), (None, "state LOADING")]:
        watch(version, state)
    watch(None, "state LOADING")  # REPEAT_S after the last line: said again, so a log never goes quiet
    watch(3, "state AVAILABLE")
    watch.close(loaded=True)
    assert said(caplog) == [
        "waiting up to 600 s (--wait) for h:8500 to load model m version 3",
        "model m version 3 after 0.2 s: UNAVAILABLE",
        "model m version 3 after 1.0 s: state LOADING",
        "model m version 3 after 12.0 s: state LOADING",
        "model m version 3 AVAILABLE after 17.2 s",
    ]


def test_on_a_terminal_a_bar_carries_the_state(capsys):
    watch = LoadWatch("model m version 3", "h:8500", 60, clock=Clock(0, 5, 6), show=True)
    watch(None, "state LOADING")
    watch.close(loaded=False)
    bar = capsys.readouterr().err
    assert "loading model m version 3" in bar and "state LOADING" in bar and "5/60" in bar


class Models:
    """GetModelStatus answering one state after another for version 3 (the last one from then on)."""

    def __init__(self, *states):
        self.states = list(states)

    def GetModelStatus(self, request, timeout):  # noqa: N802 (the gRPC stub's name)
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        response = get_model_status_pb2.GetModelStatusResponse()
        version = response.model_version_status.add(version=3, state=state)
        if state == State.END:
            version.status.error_message = "corrupt"
        return response


def test_a_wait_for_a_load_says_what_it_waits_for_and_how_long_the_load_took(caplog, monkeypatch):
    monkeypatch.setattr(status, "POLL_S", 0.0)
    caplog.set_level(logging.INFO)
    ModelStatus(Models(State.START, State.LOADING, State.LOADING, State.AVAILABLE), None, "h:8500", 1).wait_available(
        "m", 3, 600
    )
    lines = said(caplog)
    assert lines[0] == "waiting up to 600 s (--wait) for h:8500 to load model m version 3"
    assert [re.sub(r" after [\d.]+ s", "", line) for line in lines[1:]] == [
        "model m version 3: state START",
        "model m version 3: state LOADING",
        "model m version 3 AVAILABLE",
    ]


def test_a_failed_load_says_no_time_it_took(caplog, monkeypatch):
    monkeypatch.setattr(status, "POLL_S", 0.0)
    caplog.set_level(logging.INFO)
    with pytest.raises(TrainserveError, match="failed to load: corrupt"):
        ModelStatus(Models(State.LOADING, State.END), None, "h:8500", 1).wait_available("m", 3, 600)
    assert not [line for line in said(caplog) if "AVAILABLE after" in line]
