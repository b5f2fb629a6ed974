"""TF Serving's config files parsed with their real schemas; mistakes name the line."""

from __future__ import annotations

import pytest

from trainserve.errors import TrainserveError
from trainserve.serving.config import Batching, parse_batching, parse_model_config, parse_monitoring


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
        pytest.param("max_batch_size { value: 8 }\nallowed_batch_sizes: 4\n", "ending with max_batch_size (8)",
                     id="last-size"),
        pytest.param("max_batch_size { value: 8 }\nallowed_batch_sizes: 8\nallowed_batch_sizes: 4\n",
                     "expected increasing sizes", id="order"),
        pytest.param("max_batch_size { value: 0 }\n", "must be >= 1", id="zero"),
        pytest.param("batch_timeout_micros { value: -1 }\n", "must be >= 0", id="negative-timeout"),
        pytest.param("pad_variable_length_inputs: true\n", "pad_variable_length_inputs is not supported by "
                     "serve-local: expected it false", id="pad-variable-length"),
    ],
)  # fmt: skip
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
        pytest.param('model_config_list { config { name: "a" base_path: "/a" } config { name: "a" base_path: "/b" } }',
                     "configured twice", id="duplicate"),
        pytest.param('model_config_list { config { name: "a" base_path: "/a" model_platform: "pytorch" } }',
                     "expected tensorflow", id="platform"),
        pytest.param('model_config_list { config { name: "a" base_path: "/a" version_labels { key: "x-y" value: 1 }}}',
                     "expected [a-zA-Z0-9_]+", id="label-name"),
        pytest.param("model_config_list {\n  config {\n    name: 3\n  }\n}", "line 3:11", id="wrong-type"),
    ],
)  # fmt: skip
def test_bad_model_config(tmp_path, text, message):
    with pytest.raises(TrainserveError) as err:
        parse_model_config(_write(tmp_path, text))
    assert message in str(err.value)
