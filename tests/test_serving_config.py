"""TF Serving's config files parsed with their real schemas; mistakes name the line."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainserve.cli import build_parser
from trainserve.errors import TrainserveError
from trainserve.options import config_from_args
from trainserve.serving.config import Batching, ServerOptions, parse_batching, parse_model_config, parse_monitoring

pytestmark = pytest.mark.unit
IMAGE = Path(__file__).resolve().parents[1] / "images" / "serve-cpu"


def _write(tmp_path, text, name="f.config"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_batching_parameters_with_wrapper_fields(tmp_path):
    path = _write(
        tmp_path,
        "max_batch_size { value: 128 }\nbatch_timeout_micros { value: 0 }\nmax_enqueued_batches { value: 100 }\n"
        "num_batch_threads { value: 2 }\nallowed_batch_sizes: 32\nallowed_batch_sizes: 128\n",
    )
    assert parse_batching(path) == Batching(128, 0, 2, 100, (32, 128))
    assert parse_batching(None) == Batching()


@pytest.mark.parametrize(
    "text, message",
    [
        pytest.param("max_batch_size: 128\n", "line 1", id="bare-value-for-wrapper"),
        pytest.param(
            "max_batch_size { value: 8 }\nallowed_batch_sizes: 4\n", "ending with max_batch_size (8)", id="last-size"
        ),
        pytest.param(
            "max_batch_size { value: 8 }\nallowed_batch_sizes: 8\nallowed_batch_sizes: 4\n",
            "expected increasing sizes",
            id="order",
        ),
        pytest.param("max_batch_size { value: 0 }\n", "must be >= 1", id="zero"),
        pytest.param("batch_timeout_micros { value: -1 }\n", "must be >= 0", id="negative-timeout"),
        pytest.param(
            "pad_variable_length_inputs: true\n",
            "pad_variable_length_inputs is not supported by serve-local: expected it false",
            id="pad-variable-length",
        ),
    ],
)
def test_bad_batching_parameters(tmp_path, text, message):
    with pytest.raises(TrainserveError) as err:
        parse_batching(_write(tmp_path, text))
    assert message in str(err.value)


def test_monitoring_config(tmp_path):
    assert parse_monitoring(_write(tmp_path, "prometheus_config { enable: true }")) == "/monitoring/prometheus/metrics"
    assert parse_monitoring(_write(tmp_path, 'prometheus_config { enable: true path: "/m" }')) == "/m"
    assert parse_monitoring(_write(tmp_path, "prometheus_config { enable: false }")) is None


@pytest.mark.parametrize(
    "text, message",
    [
        pytest.param('model_config_list { config { name: "a" } }', "needs a name and a base_path", id="no-base"),
        pytest.param(
            'model_config_list { config { name: "a" base_path: "/a" } config { name: "a" base_path: "/b" } }',
            "configured twice",
            id="duplicate",
        ),
        pytest.param(
            'model_config_list { config { name: "a" base_path: "/a" model_platform: "pytorch" } }',
            "expected tensorflow",
            id="platform",
        ),
        pytest.param(
            'model_config_list { config { name: "a" base_path: "/a" version_labels { key: "x-y" value: 1 }}}',
            "expected [a-zA-Z0-9_]+",
            id="label-name",
        ),
        pytest.param("model_config_list {\n  config {\n    name: 3\n  }\n}", "line 3:11", id="wrong-type"),
    ],
)
def test_bad_model_config(tmp_path, text, message):
    with pytest.raises(TrainserveError) as err:
        parse_model_config(_write(tmp_path, text))
    assert message in str(err.value)


def serve_local_options(*flags: str) -> ServerOptions:
    return config_from_args(ServerOptions, build_parser().parse_args(["serve-local", *flags]))


def test_server_options_take_tensorflow_model_servers_flag_spellings():
    options = serve_local_options(
        "--model_name=digits",
        "--model_base_path",
        "/models/digits",
        "--rest_api_port=8501",
        "--enable_batching",
        "--enable_model_warmup=false",
        "--file_system_poll_wait_seconds=0",
    )
    assert options == ServerOptions(
        model_name="digits",
        model_base_path="/models/digits",
        rest_api_port=8501,
        enable_batching=True,
        enable_model_warmup=False,
        file_system_poll_wait_seconds=0,
    )
    assert serve_local_options() == ServerOptions(), "no flag: tensorflow_model_server's defaults"


def test_a_bad_bool_flag_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        serve_local_options("--enable_batching=maybe")
    assert exit_.value.code == 2
    assert "'maybe': expected true or false" in capsys.readouterr().err


def test_the_images_config_files_parse():
    """What the serve-cpu image bakes in is read with the same messages as tensorflow_model_server reads it."""
    batching = parse_batching(IMAGE / "batching.config")
    assert batching.max_batch_size >= 1 and batching.allowed_batch_sizes[-1:] in ((), (batching.max_batch_size,))
    assert parse_monitoring(IMAGE / "monitoring.config") == "/monitoring/prometheus/metrics"
