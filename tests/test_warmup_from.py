"""`train --warmup-from CAPTURES`: the version's warmup requests are the captured requests its signature takes,
checked before training; serve-local replays them when it loads the version."""

from __future__ import annotations

import numpy as np
import pytest

from captures import capture_name, prediction_log, write_capture
from trainserve.errors import TrainserveError
from trainserve.layout import read_warmup_inputs
from trainserve.training.config import TrainConfig
from trainserve.training.run import train


def capture(directory, requests: list[tuple[str, np.ndarray]]):
    write_capture(
        directory / capture_name(0),
        [prediction_log(m, {"images": x}, request_id=str(i)) for i, (m, x) in enumerate(requests)],
    )
    return directory


@pytest.mark.integration
def test_captured_requests_become_the_warmup_and_the_version_loads(tmp_path, serve_in_process):
    rng = np.random.default_rng(0)
    fitting = [rng.integers(0, 17, (n, 8, 8, 1), dtype=np.uint8) for n in (1, 3, 7)]
    captured = capture(
        tmp_path / "cap",
        [
            ("wd", fitting[0]),
            ("wd", np.zeros((2, 9, 9, 1), np.uint8)),
            ("other", fitting[1]),
            ("wd", fitting[1]),
            ("wd", fitting[2].astype(np.float32)),
            ("wd", fitting[2]),
        ],
    )
    config = one_epoch(tmp_path, captured)
    result = train(config)
    warmup = read_warmup_inputs(result.version_dir)
    assert [signature for signature, _ in warmup] == ["serving_default"] * 3
    for (_, inputs), images in zip(warmup, fitting, strict=True):
        np.testing.assert_array_equal(inputs["images"], images)
    server = serve_in_process("--model_name=wd", f"--model_base_path={tmp_path / 'models' / 'wd'}")
    server.wait_available("wd", 1)
    assert "warmup" in server.log().lower()


@pytest.mark.unit
def test_a_capture_nothing_of_which_fits_is_one_line_before_training(tmp_path):
    captured = capture(tmp_path / "cap", [("wd", np.zeros((2, 9, 9, 1), np.uint8))])
    config = one_epoch(tmp_path, captured)
    with pytest.raises(TrainserveError, match="none of 1 captured request\\(s\\) of model 'wd' fits") as err:
        train(config)
    assert "images uint8 [8, 8, 1]" in str(err.value)
    assert not list(tmp_path.rglob("saved_model.pb")) and not list(tmp_path.rglob("history.csv")), "nothing trained"


def one_epoch(root, captured) -> TrainConfig:
    """One epoch of model wd under `root`, its warmup requests taken from the capture."""
    return TrainConfig(
        model_name="wd",
        epochs=1,
        export_base=root / "models",
        data_dir=root / "data",
        logs_dir=root / "logs",
        warmup_from=captured,
    )
