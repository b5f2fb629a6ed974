"""`trainserve load --pin-version false`: requests name the label (or no version), as a client's do, so that a
proxy routing `stable` routes them (the compose `load` service); by default each names the version resolved at
the start, as every point of the sweep always has."""

from __future__ import annotations

import numpy as np
import pytest

from trainserve.client import Signature, Target
from trainserve.evaluation.load.config import LoadConfig
from trainserve.evaluation.load.inputs import build_inputs
from trainserve.protos import predict_pb2
from trainserve.savedmodel import TensorSpecInfo

pytestmark = pytest.mark.unit

SIGNATURE = Signature({"x": TensorSpecInfo("x", "x:0", np.dtype("float32"), (None, 3))}, {})


@pytest.mark.parametrize("pin, label, version", [(True, "", 7), (False, "stable", 0)])
def test_requests_name_the_label_unless_pinned(pin, label, version):
    config = LoadConfig(model="m", label="stable", pin_version=pin, batch_sizes=(1,))
    target = Target(config.model, config.version, config.label, config.signature)
    inputs = build_inputs(config, None, SIGNATURE, target, 7)
    spec = predict_pb2.PredictRequest.FromString(inputs.requests[1][0].payload).model_spec
    assert (spec.name, spec.version_label, spec.version.value) == ("m", label, version)
