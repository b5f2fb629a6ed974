"""`trainserve eval` against serve-local over real gRPC: on a thread of this process, or a subprocess where only a
process shows it (killed and restarted)."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from conftest import MONITORING, assert_one_line_error, install_version, predict_count, run_cli, serve_counted
from trainserve.cli import main
from trainserve.client import predict as client_predict
from trainserve.evaluation.config import EvalConfig
from trainserve.evaluation.data import open_eval_data
from trainserve.evaluation.run import evaluate
from trainserve.evidence.document import validate_report
from trainserve.savedmodel import LoadedModel
from trainserve.sources import SyntheticSpec, load_dataset
from trainserve.tensors import from_tensor_proto, to_tensor_proto

RETRY_POLL_S = 0.25
LONG_RUN = {"data": "synthetic", "synthetic": SyntheticSpec((8, 8, 1), 10, 40000), "batch_size": 16, "concurrency": 2}


@pytest.fixture(scope="module")
def served(model_versions, tmp_path_factory):
    """serve-local with model m (v1) and Prometheus request counters on the REST port."""
    root = tmp_path_factory.mktemp("eval")
    install_version(model_versions[0], root / "m", 1)
    server = serve_counted(root, "m")
    yield server
    assert server.stop() == 0


@pytest.mark.unit
def test_metrics_equal_in_process_computation(served, model_versions, tmp_path):
    config = EvalConfig(server=served.target, model="m", data="digits", batch_size=50, report=tmp_path / "r.json")
    report = evaluate(config).report
    ds = load_dataset("digits")
    out = LoadedModel(model_versions[0]).run("serving_default", {"images": ds.x_test})
    confusion = np.zeros((10, 10), np.int64)
    np.add.at(confusion, (ds.y_test, out["classes"]), 1)
    assert report["data"]["examples"] == len(ds.y_test) == 360
    assert report["metrics"]["confusion_matrix"] == confusion.tolist()
    assert report["metrics"]["accuracy"] == pytest.approx(np.mean(out["classes"] == ds.y_test))
    p = out["probabilities"][np.arange(360), ds.y_test]
    assert report["metrics"]["loss"] == pytest.approx(-np.mean(np.log(np.clip(p, 1e-7, 1))), rel=1e-5)
    top5 = np.argsort(-out["probabilities"], axis=1)[:, :5]
    assert report["metrics"]["top_k_accuracy"] == pytest.approx(np.mean((top5 == ds.y_test[:, None]).any(1)))
    assert report["version"] == 1 and report["performance"]["requests"] == 8  # ceil(360 / 50)
    validate_report(report)


@pytest.mark.integration
def test_cli_writes_valid_report_and_plots_and_gates(served, model_versions, tmp_path, capsys):
    code = main(
        [
            "eval",
            "--server",
            served.target,
            "--model",
            "m",
            "--data",
            "digits",
            "--report",
            str(tmp_path / "r.json"),
            "--plots",
            str(tmp_path / "plots"),
            "--compare-local",
            str(model_versions[0]),
            "--min-accuracy",
            "0.99",
        ]
    )
    out = capsys.readouterr()
    assert code == 1, "an untrained model is below 0.99: the gate fails"
    assert "gate failed: accuracy" in out.err.strip().splitlines()[-1] and "is not >= 0.99" in out.err
    assert "accuracy" in out.out and "gate" in out.out and "FAIL" in out.out
    report = json.loads((tmp_path / "r.json").read_text())
    validate_report(report)
    assert report["passed"] is False and report["min_accuracy"] == 0.99
    assert report["gates"] == [
        {"metric": "accuracy", "op": ">=", "threshold": 0.99, "value": report["metrics"]["accuracy"], "passed": False}
    ]
    assert report["compare_local"]["max_abs_diff"] <= 1e-6 and report["compare_local"]["class_agreement"] == 1.0
    import matplotlib.image

    for name in ("confusion_matrix.png", "latency_histogram.png"):
        path = tmp_path / "plots" / name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert matplotlib.image.imread(path).shape[0] > 100


@pytest.mark.unit
def test_schema_rejects_a_broken_report(served):
    import jsonschema

    report = evaluate(EvalConfig(server=served.target, model="m", data="digits", limit=10)).report
    validate_report(report)
    report["metrics"]["accuracy"] = 1.5
    with pytest.raises(jsonschema.ValidationError):
        validate_report(report)


@pytest.mark.unit
def test_float_val_and_tensor_content_decode_to_the_same_numbers(model_versions):
    images = load_dataset("digits").x_test[:16]
    outputs = LoadedModel(model_versions[0]).run("serving_default", {"images": images})
    for value in outputs.values():
        as_values, as_bytes = to_tensor_proto(value, as_values=True), to_tensor_proto(value)
        assert as_values.HasField("tensor_shape") and not as_values.tensor_content and as_bytes.tensor_content
        np.testing.assert_array_equal(from_tensor_proto(as_values), from_tensor_proto(as_bytes))
        np.testing.assert_array_equal(from_tensor_proto(as_values), value)


@pytest.mark.integration
def test_server_killed_and_restarted_mid_run_loses_nothing(serve_local, model_versions, tmp_path, monkeypatch):
    install_version(model_versions[0], tmp_path / "m", 1)
    (tmp_path / "monitoring.config").write_text(MONITORING)
    flags = (
        "--model_name=m",
        f"--model_base_path={tmp_path / 'm'}",
        f"--monitoring_config_file={tmp_path / 'monitoring.config'}",
    )
    server = serve_local(*flags)
    server.wait_available("m", 1)
    baseline = evaluate(EvalConfig(server=server.target, model="m", **LONG_RUN, limit=8000)).report
    result, errors, retried = {}, [], threading.Event()
    backoff_delay = client_predict.backoff_delay

    def noted_backoff(attempt, *args):  # called before each retry: the outage has been seen
        retried.set()
        # The client's own backoff, capped: its 4-8 s steps would leave the run asleep long after the new
        # server is up (a poll, not a sleep, decides when the test goes on; the delays are tested below).
        return min(backoff_delay(attempt, *args), RETRY_POLL_S)

    monkeypatch.setattr(client_predict, "backoff_delay", noted_backoff)

    def run():
        # Retries enough to outlast any restart (each waits out its 10 s deadline or fails at once, then backs off
        # up to RETRY_POLL_S): how long a busy machine takes to start a server must not decide the test; the join
        # below bounds a broken run.
        config = EvalConfig(server=server.target, model="m", **LONG_RUN, limit=8000, retries=1000)
        try:
            result["report"] = evaluate(config).report
        except Exception as exc:  # the assertion below shows it
            errors.append(exc)

    worker = threading.Thread(target=run)
    before = predict_count(server)
    worker.start()
    # Killed in the middle: after the run's first 10 answers, with 490 of its 500 requests still to send.
    server.wait_for(lambda: predict_count(server) >= before + 10, "the run to get its first answers")
    server.proc.kill()
    server.proc.wait()
    assert retried.wait(60), "the run retried a request the dead server did not answer"
    serve_local(*flags, f"--port={server.port}").wait_available("m", 1, timeout=600)  # same gRPC port
    worker.join(timeout=600)
    assert not worker.is_alive() and not errors, errors
    report = result["report"]
    assert report["data"]["examples"] == 8000 == baseline["data"]["examples"]
    assert report["metrics"]["confusion_matrix"] == baseline["metrics"]["confusion_matrix"]
    assert report["metrics"]["loss"] == pytest.approx(baseline["metrics"]["loss"], rel=1e-9)
    assert report["performance"]["retries"] >= 1, "the outage was crossed by retrying"


@pytest.mark.integration
def test_version_published_mid_run_does_not_mix_versions(serve_in_process, model_versions, tmp_path, monkeypatch):
    install_version(model_versions[0], tmp_path / "m", 1)
    config = tmp_path / "models.config"
    config.write_text(
        f'model_config_list {{ config {{ name: "m" base_path: "{tmp_path / "m"}" model_platform: "tensorflow" '
        "model_version_policy { latest { num_versions: 2 } } } }"
    )
    server = serve_in_process(f"--model_config_file={config}")
    server.wait_available("m", 1)
    # Version 1 answers the run's first request (which pins it), then holds the rest until version 2 is served.
    held, release, v1_runs, run = threading.Event(), threading.Event(), [], LoadedModel.run

    def held_after_the_first(model, *args, **kwargs):
        if model.path.name == "1":
            v1_runs.append(1)
            if len(v1_runs) > 1:
                held.set()
                assert release.wait(60), "the test never released version 1"
        return run(model, *args, **kwargs)

    monkeypatch.setattr(LoadedModel, "run", held_after_the_first)
    result = {}
    worker = threading.Thread(
        target=lambda: result.update(report=evaluate(EvalConfig(server=server.target, model="m", **LONG_RUN)).report)
    )
    worker.start()
    assert held.wait(60), "the run got its first answer and sent the next requests"
    install_version(model_versions[1], tmp_path / "m", 2)
    server.wait_available("m", 2)
    assert worker.is_alive(), "version 2 arrived while the evaluation was running"
    release.set()
    worker.join(timeout=180)
    report = result["report"]
    assert report["version"] == 1 and report["performance"]["failed_requests"] == 0
    assert report["data"]["examples"] == 40000 and sum(map(sum, report["metrics"]["confusion_matrix"])) == 40000


def _npz(tmp_path, name, **arrays):
    path = tmp_path / f"{name}.npz"
    np.savez(path, **arrays)
    return str(path)


@pytest.mark.unit
@pytest.mark.parametrize(
    "args, fragment",
    [
        pytest.param(["--model", "nope"], "model 'nope' not found on", id="unknown-model"),
        pytest.param(["--signature", "predict"], "signature 'predict' not found", id="unknown-signature"),
        pytest.param(
            ["--data", "{shape}"],
            "shaped uint8 [None, 8, 8, 1]; the data's 'images' examples are [9, 9]",
            id="wrong-shape",
        ),
        pytest.param(["--data", "{dtype}"], "wants 'images' as uint8; the data's 'x' is float32", id="wrong-dtype"),
        pytest.param(["--data", "{labels}"], "the data has label 12 but", id="too-many-classes"),
        pytest.param(
            ["--data", "{tmp}/none.npz"], "not found: expected digits, synthetic, a .csv or an .npz", id="no-file"
        ),
        pytest.param(["--version", "9", "--wait", "1"], "version 9 not AVAILABLE", id="unknown-version"),
    ],
)
def test_bad_requests_fail_before_any_predict(served, tmp_path, capsys, args, fragment):
    subs = {
        "tmp": tmp_path,
        "shape": _npz(tmp_path, "shape", x_test=np.zeros((4, 9, 9), np.uint8), y_test=np.zeros(4, np.int64)),
        "dtype": _npz(tmp_path, "dtype", x_test=np.zeros((4, 8, 8), np.float32), y_test=np.zeros(4, np.int64)),
        "labels": _npz(tmp_path, "labels", x_test=np.zeros((4, 8, 8), np.uint8), y_test=np.array([0, 1, 2, 12])),
    }
    before = predict_count(served)
    code = main(["eval", "--server", served.target, "--model", "m", *[a.format(**subs) for a in args]])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "error:" in err[-1] and fragment in err[-1], err[-1]
    assert predict_count(served) == before, "no Predict was sent"


@pytest.mark.integration
def test_unreachable_server_and_impossible_deadline(served, tmp_path):
    from conftest import free_port

    proc = run_cli("eval", "--server", f"127.0.0.1:{free_port()}", "--model", "m", "--wait", "1", cwd=tmp_path)
    assert_one_line_error(proc, "not AVAILABLE on 127.0.0.1:", "within --wait 1 s")
    proc = run_cli(
        "eval",
        "--server",
        served.target,
        "--model",
        "m",
        "--timeout",
        "0.00001",
        "--retries",
        "2",
        "--wait",
        "30",
        cwd=tmp_path,
        env={"TRAINSERVE_DATA": "digits"},
    )
    assert_one_line_error(proc, "DEADLINE_EXCEEDED", "is --timeout 1e-05 s long enough?")


@pytest.mark.unit
def test_npz_is_streamed_not_loaded(tmp_path):
    x = np.random.default_rng(0).integers(0, 256, (1000, 8, 8), dtype=np.uint8)
    y = np.arange(1000) % 10
    path = tmp_path / "big.npz"
    np.savez_compressed(path, x_test=x, y_test=y)
    data = open_eval_data(str(path), limit=999)
    assert data.columns["images"].shape == (8, 8) and data.count == 999
    batches = list(data.batches(256))
    assert [len(b[1]) for b in batches] == [256, 256, 256, 231]
    np.testing.assert_array_equal(np.concatenate([b[0]["images"] for b in batches]), x[:999])
    np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), y[:999])


@pytest.mark.unit
def test_backoff_grows_is_capped_and_jittered():
    import random

    from trainserve.client.predict import BACKOFF_BASE_S, BACKOFF_MAX_S, backoff_delay

    rng = random.Random(0)
    for attempt in range(12):
        step = min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2**attempt)
        delays = {backoff_delay(attempt, rng) for _ in range(50)}
        assert all(step / 2 <= d <= step for d in delays), "half fixed, half random, never above the cap"
        assert len(delays) > 1, "jittered"
    assert backoff_delay(30, rng) <= BACKOFF_MAX_S
