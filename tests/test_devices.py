"""Precision and strategy choice from what the machine has."""

import pytest

from trainserve.errors import TrainserveError
from trainserve.training.devices import resolve_mixed_precision

pytestmark = pytest.mark.unit

V100, T4, P100 = ({"compute_capability": [7, 0]}, {"compute_capability": [7, 5]}, {"compute_capability": [6, 0]})


@pytest.mark.parametrize(
    "mode, gpus, expected",
    [
        pytest.param("auto", [], False, id="auto-cpu"),
        pytest.param("auto", [V100], True, id="auto-volta"),
        pytest.param("auto", [T4, V100], True, id="auto-two-tensor-core-gpus"),
        pytest.param("auto", [P100], False, id="auto-pascal"),
        pytest.param("auto", [T4, P100], False, id="auto-mixed-fleet"),
        pytest.param("on", [], True, id="forced-on-cpu"),
        pytest.param("off", [V100], False, id="forced-off"),
    ],
)
def test_mixed_precision_choice(mode, gpus, expected):
    assert resolve_mixed_precision(mode, gpus) is expected


def test_unknown_mode_is_rejected():
    with pytest.raises(TrainserveError, match="expected auto, on or off"):
        resolve_mixed_precision("fp8", [])
