"""`trainserve replay` under the faults production brings (issue 45), each on a real serve-local in this process and
real gRPC: a replay against the capturing server it reads, a candidate unloaded mid-replay, a candidate whose graph
fails some requests, a server that goes away, captured requests of another signature. Each fault is provoked by an
event (after the N-th answered call), never by a clock."""

from __future__ import annotations

import json
import threading

import grpc
import numpy as np
import pytest
from scorers import save_scorer, traffic

from captures import capture_name, prediction_log, write_capture
from conftest import free_port, install_version
from serving_fixtures import predict_request, stubs
from trainserve.cli import main
from trainserve.errors import TrainserveError
from trainserve.evidence.flips import replay_failures
from trainserve.model_server_config import render_model_config, single_model_config
from trainserve.replay import run as replay_run
from trainserve.replay.report import validate_report
from trainserve.tfrecord import iter_records

# The unit tests here: serve-local on a thread of this process, real gRPC.

SCORERS = {1: {}, 2: {"moves_class_2": True}, 4: {"refuses_above": 1.0}}  # stable, a mover, a partly broken graph


@pytest.fixture(scope="module")
def scorer_base(tmp_path_factory):
    root = tmp_path_factory.mktemp("scorers")
    for version, variant in SCORERS.items():
        install_version(save_scorer(root / f"scorer-{version}", **variant), root / "scorer", version)
    return root / "scorer"


def write_models_config(path, base, versions, labels, capture_prefix=None):
    """`scorer` served from `base`, exactly `versions` loaded, `labels` set; logging every call under the prefix."""
    config = single_model_config("scorer", str(base))
    entry = config.model_config_list.config[0]
    entry.model_version_policy.specific.versions.extend(versions)
    entry.version_labels.update(labels)
    if capture_prefix is not None:
        entry.logging_config.sampling_config.sampling_rate = 1.0
        entry.logging_config.log_collector_config.filename_prefix = str(capture_prefix)
    path.write_text(render_model_config(config))
    return path


def start_scorers(serve_in_process, tmp_path, base, versions, labels, *flags, capture_prefix=None):
    config = write_models_config(tmp_path / "models.config", base, versions, labels, capture_prefix)
    server = serve_in_process(f"--model_config_file={config}", "--allow_version_labels_for_unavailable_models", *flags)
    for version in versions:
        server.wait_available("scorer", version)
    return server


def replay_cli(server, tmp_path, *args) -> tuple[int, dict | None]:
    report = tmp_path / "replay.json"
    code = main(["replay", *map(str, args), "--server", server.target, "--model", "scorer", "--report", str(report)])
    return code, json.loads(report.read_text()) if report.is_file() else None


def capture_of(directory, sent) -> None:
    """`sent` as one captured record each, 10 to a file, as a capture writes them."""
    records = [prediction_log("scorer", b, request_id=f"r{i}") for i, b in enumerate(sent)]
    for start in range(0, len(records), 10):
        write_capture(directory / capture_name(start // 10), records[start : start + 10])


def after_answers(monkeypatch, version: int, count: int, then) -> None:
    """Run `then()` once, in the replay's own thread, right after `version` answered its `count`-th call: the
    fault comes at a known point of the replay (with --concurrency 1, every later call of that version sees it)."""
    real, answered, lock = replay_run.predict, [0], threading.Lock()

    def predict(stub, request, target, pinned, *args, **kwargs):
        answer = real(stub, request, target, pinned, *args, **kwargs)
        with lock:
            answered[0] += pinned == version
            if pinned == version and answered[0] == count:
                then()
        return answer

    monkeypatch.setattr(replay_run, "predict", predict)


@pytest.mark.integration
def test_a_replay_against_the_capturing_server_it_reads_replays_the_real_requests_once(
    scorer_base, tmp_path, serve_in_process
):
    """Item 1: a third-party client's 30 calls captured; the replay, against that same capturing server, reads
    the 30 (its own calls, captured or not, are left out) and ends, instead of feeding on its own traffic."""
    captures = tmp_path / "captures"
    server = start_scorers(
        serve_in_process,
        tmp_path,
        scorer_base,
        (1, 2),
        {"stable": 1, "candidate": 2},
        "--capture_max_file_mb=0.02",  # files of about 60 records: the one being written is the one read last
        capture_prefix=captures / "scorer",
    )
    predict, _ = stubs(server)
    sent = traffic(seed=11, requests=30)
    for batch in sent:
        predict.Predict(predict_request("scorer", **batch), timeout=30)

    def on_disk() -> int:
        return sum(1 for path in captures.glob("*.tfrecord") for _ in iter_records(open(path, "rb")))  # noqa: SIM115

    server.wait_for(lambda: on_disk() == len(sent), "the 30 calls written")
    code, report = replay_cli(server, tmp_path, captures, "--label", "candidate", "--max-flip-rate", "0.5")
    validate_report(report)
    x = np.concatenate([b["x"] for b in sent])
    assert report["requests"]["replayed"] == report["capture"]["kept"] == len(sent)
    assert report["flips"]["examples"] == len(x) and report["flips"]["count"] == int(np.sum(x.argmax(axis=1) == 2))
    assert report["error_share"]["candidate"] == report["error_share"]["baseline"] == 0.0 and code == 0


def unload(server, config, base, keep: int):
    """Serve `keep` alone (the config polled once a second), and return once the server says the rest went."""

    def apply() -> None:
        write_models_config(config, base, (keep,), {"stable": keep})
        server.wait_for(lambda: set(server.versions("scorer")) - {keep} <= _ended(server), "the candidate unloaded")

    return apply


def _ended(server) -> set[int]:
    return {v for v, state in server.versions("scorer").items() if state == "END"}


@pytest.mark.integration
def test_a_candidate_unloaded_mid_replay_fails_the_gate_and_promote_refuses_it(
    scorer_base, tmp_path, serve_in_process, monkeypatch
):
    """Item 2: the candidate unloaded after its 10th answer; its other 30 requests NOT_FOUND (75 %). The error
    gate fails the replay, whose flip gate alone would pass on the 10 pairs left, and promote refuses it."""
    server = start_scorers(
        serve_in_process,
        tmp_path,
        scorer_base,
        (1, 2),
        {"stable": 1, "candidate": 2},
        "--model_config_file_poll_wait_seconds=1",
    )
    sent = traffic(seed=5, requests=40)
    capture_of(tmp_path / "capture", sent)
    after_answers(monkeypatch, 2, 10, unload(server, tmp_path / "models.config", scorer_base, keep=1))
    code, report = replay_cli(
        server, tmp_path, tmp_path / "capture", "--label", "candidate", "--max-flip-rate", "0.5", "--concurrency", "1"
    )
    validate_report(report)
    assert report["errors"] == {"candidate": {"NOT_FOUND": 30}, "baseline": {}}
    assert report["requests"]["replayed"] == 40 and report["requests"]["paired"] == 10
    assert code == 1 and report["passed"] is False
    assert report["error_share"]["candidate"] == 30 / 40
    gates = {g["kind"]: g for g in report["gates"]}
    assert gates["max_flip_rate"]["passed"] is True and gates["max_error_rate"]["passed"] is False
    assert "candidate 30 of 40 (0.7500: NOT_FOUND 30)" in gates["max_error_rate"]["said"]
    # Promote judges the report's counts again: refused, however the report's verdict were edited.
    report["passed"] = gates["max_error_rate"]["passed"] = True
    assert any("says passed=True but its counts say False" in f for f in replay_failures(report))


@pytest.mark.integration
def test_a_candidate_whose_graph_fails_some_requests_fails_the_gate(scorer_base, tmp_path, serve_in_process):
    """Item 2: version 4 refuses every request with an x[:, 0] above 1 (INVALID_ARGUMENT) and stable answers
    them; that share, counted independently here, is the candidate's own, and fails --max-error-rate."""
    server = start_scorers(serve_in_process, tmp_path, scorer_base, (1, 4), {"stable": 1, "candidate": 4})
    sent = traffic(seed=8, requests=51)
    capture_of(tmp_path / "capture", sent)
    code, report = replay_cli(server, tmp_path, tmp_path / "capture", "--label", "candidate", "--max-flip-rate", "0.5")
    refused = sum(int((b["x"][:, 0] > 1.0).any()) for b in sent)
    assert 0 < refused < len(sent)
    assert report["errors"] == {"candidate": {"INVALID_ARGUMENT": refused}, "baseline": {}}
    assert code == 1 and report["passed"] is False
    assert report["error_share"]["candidate"] == refused / len(sent) and report["error_share"]["refused_by_both"] == 0
    assert report["flips"]["count"] == 0 and report["flips"]["examples"] == sum(
        len(b["x"]) for b in sent if not (b["x"][:, 0] > 1.0).any()
    )
    assert replay_failures(report)[0].startswith(f"error share candidate {refused} of {len(sent)}")


@pytest.mark.unit
def test_a_server_that_goes_away_mid_replay_ends_it_in_one_line(
    scorer_base, tmp_path, serve_in_process, monkeypatch, capsys
):
    """Item 10: the server stopped after the candidate's 5th answer: the replay ends after --unanswered pairs
    (no 4 x 10 s waits per pair), in one line; a server that is not there at all is one line too."""
    server = start_scorers(serve_in_process, tmp_path, scorer_base, (1, 2), {"stable": 1, "candidate": 2})
    capture_of(tmp_path / "capture", traffic(seed=2, requests=200))
    after_answers(monkeypatch, 2, 5, server.stop)
    code, report = replay_cli(
        server, tmp_path, tmp_path / "capture", "--label", "candidate", "--concurrency", "1", "--retries", "1"
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and report is None and len(err.splitlines()) == 1, err
    assert f"{server.target} stopped answering: 3 request pairs in a row failed after" in err, err
    assert "UNAVAILABLE" in err and "Traceback" not in err
    dead = f"127.0.0.1:{free_port()}"
    args = ["replay", str(tmp_path / "capture"), "--server", dead, "--model", "scorer", "--wait", "0"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and dead in err and "Traceback" not in err, err


@pytest.mark.integration
def test_signature_replays_the_requests_of_that_signature_and_counts_the_others(
    scorer_base, tmp_path, serve_in_process
):
    """Item 10: `--signature serving_default` replays the requests that named it; those of another signature are
    skipped and counted, not sent as if they had named it."""
    server = start_scorers(serve_in_process, tmp_path, scorer_base, (1, 2), {"stable": 1, "candidate": 2})
    sent = traffic(seed=4, requests=12)
    records = [
        prediction_log("scorer", b, request_id=f"r{i}", signature="serving_default" if i % 3 else "explain")
        for i, b in enumerate(sent)
    ]
    write_capture(tmp_path / "capture" / capture_name(0), records)
    code, report = replay_cli(
        server, tmp_path, tmp_path / "capture", "--label", "candidate", "--signature", "serving_default"
    )
    named = [b for i, b in enumerate(sent) if i % 3]
    assert code == 0 and report["requests"]["replayed"] == len(named) and report["capture"]["other_signature"] == 4
    assert report["flips"]["examples"] == sum(len(b["x"]) for b in named)


class Listener:
    """A real gRPC server that answers every method NOT_FOUND and keeps each call's metadata."""

    def __init__(self):
        from concurrent import futures

        self.calls: list[tuple[str, dict[str, str]]] = []
        listener = self

        class Everything(grpc.GenericRpcHandler):
            def service(self, details):
                def refuse(request, context):
                    listener.calls.append((details.method, dict(context.invocation_metadata())))
                    context.abort(grpc.StatusCode.NOT_FOUND, "no such model")

                return grpc.unary_unary_rpc_method_handler(refuse)

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[Everything()])
        self.target = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()


@pytest.fixture
def listener():
    started = Listener()
    yield started
    started.server.stop(grace=None)


@pytest.mark.unit
def test_trainserves_own_calls_say_where_they_come_from(listener, tmp_path, capsys):
    """Every call of a replay carries `x-trainserve-origin: replay` (so a capturing server can leave it out); eval's
    and load's clients say `eval` and `load`; a client that names no origin sends none."""
    from trainserve.client import ServingClient, Target

    capture_of(tmp_path / "capture", traffic(requests=2))
    assert main(["replay", str(tmp_path / "capture"), "--server", listener.target, "--model", "scorer"]) == 2
    assert "no such model" in capsys.readouterr().err
    for origin in ("eval", "load", None):
        with ServingClient(listener.target, origin=origin) as client, pytest.raises(TrainserveError):
            client.predict(Target("scorer"), {"x": np.zeros((1, 4), np.float32)}, ["probabilities"], 1, 0)
    said = [(method.rsplit("/", 1)[1], metadata.get("x-trainserve-origin")) for method, metadata in listener.calls]
    assert said[0] == ("GetModelMetadata", "replay") and {o for _, o in said[:-3]} == {"replay"}  # the label
    assert said[-3:] == [("Predict", "eval"), ("Predict", "load"), ("Predict", None)]
