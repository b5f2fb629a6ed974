"""The shadow's comparison of two answers against an independent count, example by example in plain Python, over
random outputs (hypothesis): names only one version has, shapes and dtypes that differ, both wire encodings, and
every kind of classification output (scores, class ids, sigmoids named so), and regression outputs of any shape."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from trainserve.protos import predict_pb2
from trainserve.proxy.shadow_compare import Comparison, Incomparable, compare
from trainserve.tensors import to_tensor_proto

NUMERIC = (np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8, np.bool_)


def answer(outputs: dict[str, np.ndarray], as_values: bool = False) -> bytes:
    message = predict_pb2.PredictResponse()
    for name, array in outputs.items():
        to_tensor_proto(array, as_values=as_values, into=message.outputs[name])
    return message.SerializeToString()


def class_of(array: np.ndarray, i: int, name: str):
    """Example i's class, or None when output `name` is not a classification output: written out by hand."""
    kind, shape = array.dtype.kind, array.shape
    if kind == "f" and name == "predictions":  # the regression head
        return None
    if kind == "f" and len(shape) == 2 and shape[1] > 1:
        row = [float(v) for v in array[i]]
        return row.index(max(row))  # the first of equal maxima, as argmax
    if kind in "iub" and (len(shape) == 1 or (len(shape) == 2 and shape[1] == 1)):
        return int(array.ravel()[i])
    if kind == "f" and len(shape) == 2 and shape[1] == 1 and name in ("probabilities", "logistic"):
        return float(array[i][0]) > 0.5
    return None


def expected(stable: dict, candidate: dict) -> Comparison | None:
    """What compare must say, None for incomparable."""
    common = [
        k
        for k in stable
        if k in candidate
        and stable[k].shape == candidate[k].shape
        and stable[k].dtype == candidate[k].dtype
        and stable[k].dtype.kind in "fiub"
        and stable[k].ndim > 0
    ]
    if not common or len({stable[k].shape[0] for k in common}) > 1:
        return None
    n = stable[common[0]].shape[0]
    classifying = [
        k for k in common if class_of(np.zeros((1, *stable[k].shape[1:]), stable[k].dtype), 0, k) is not None
    ]
    flips = sum(any(class_of(stable[k], i, k) != class_of(candidate[k], i, k) for k in classifying) for i in range(n))
    diffs = [
        abs(float(b) - float(a))
        for k in common
        if k not in classifying
        for a, b in zip(stable[k].ravel(), candidate[k].ravel(), strict=True)
    ]
    return Comparison(n, n if classifying else 0, flips, math.fsum(diffs))


@st.composite
def output_pairs(draw):
    """Stable's outputs and the candidate's: most alike in name, shape and dtype, some not."""
    n = draw(st.integers(0, 5))
    stable, candidate = {}, {}
    names = st.sampled_from(["a", "b", "c", "d", "probabilities", "logistic", "predictions"])
    for name in draw(st.lists(names, unique=True, max_size=4)):
        dtype = draw(st.sampled_from((*NUMERIC, object)))
        shape = draw(st.sampled_from([(n,), (n, 1), (n, 3), (n, 2, 2), (), (n + 1, 2)]))
        stable[name] = draw(values(dtype, shape))
        fate = draw(st.sampled_from(["fresh", "fresh", "same", "missing", "other shape", "other dtype"]))
        if fate == "same":
            candidate[name] = stable[name].copy()
        elif fate == "fresh":
            candidate[name] = draw(values(dtype, shape))
        elif fate == "other shape":
            candidate[name] = draw(values(dtype, (n, 4)))
        elif fate == "other dtype":
            candidate[name] = draw(values(draw(st.sampled_from(NUMERIC)), shape))
    for name in draw(st.lists(st.sampled_from("uvw"), unique=True, max_size=2)):  # the candidate's own outputs
        candidate[name] = draw(values(np.float32, (n, 2)))
    return stable, candidate


def values(dtype, shape):
    if dtype is object:
        return arrays(object, shape, elements=st.text(max_size=3))
    if np.dtype(dtype).kind == "f":
        width = np.dtype(dtype).itemsize * 8
        near_threshold = st.sampled_from([0.25, 0.375, 0.5, 0.625, 0.75])  # exact in float16 too
        return arrays(dtype, shape, elements=near_threshold | st.floats(-1, 2, width=width))
    if np.dtype(dtype).kind in "iu":
        return arrays(dtype, shape, elements=st.integers(0, 3))  # few values: ties and agreements
    return arrays(dtype, shape)


@pytest.mark.integration
@settings(max_examples=100, deadline=None)
@given(pair=output_pairs(), as_values=st.booleans())
def test_compare_equals_a_count_made_example_by_example(pair, as_values):
    stable, candidate = pair
    want = expected(stable, candidate)
    if want is None:
        with pytest.raises(Incomparable):
            compare(answer(stable, as_values), answer(candidate))
        return
    got = compare(answer(stable, as_values), answer(candidate))
    assert (got.pairs, got.classified, got.flips) == (want.pairs, want.classified, want.flips)
    assert got.abs_diff == pytest.approx(want.abs_diff, rel=1e-9, abs=1e-9)


@pytest.mark.unit
def test_class_ids_and_sigmoids_count_flips_and_an_added_output_is_ignored():
    stable = {"classes": np.array([0, 1, 2, 1], np.int64), "logistic": np.array([[0.2], [0.7], [0.5], [0.9]])}
    candidate = {"classes": np.array([0, 2, 2, 1], np.int64), "logistic": np.array([[0.2], [0.7], [0.6], [0.4]])}
    candidate["new_head"] = np.ones((4, 3), np.float32)
    assert compare(answer(stable), answer(candidate)) == Comparison(4, 4, 3, 0.0)  # examples 1, 2 and 3 flip
    regression = {"score": np.array([1.0, 2.0], np.float32)}
    assert compare(answer(regression), answer({"score": np.array([1.5, 1.0], np.float32)})) == Comparison(2, 0, 0, 1.5)


@pytest.mark.unit
@pytest.mark.parametrize(
    "candidate",
    [
        pytest.param({"other": np.ones((2, 2), np.float32)}, id="no-name-in-common"),
        pytest.param({"p": np.ones((3, 2), np.float32)}, id="other-shape"),
        pytest.param({"p": np.array(["a", "b"], object)}, id="strings"),
    ],
)
def test_answers_with_nothing_comparable_in_common_are_incomparable(candidate):
    with pytest.raises(Incomparable):
        compare(answer({"p": np.ones((2, 2), np.float32)}), answer(candidate))


@pytest.mark.unit
def test_a_regression_models_one_target_is_compared_as_a_regression_not_a_sigmoid():
    """A float [N, 1] not named as a binary classifier's head (a regression model's one target), and the regression
    head `predictions` of any shape: |candidate - stable| summed, nothing classified, no flip."""
    for name, shape in (("predictions", (4, 1)), ("output_0", (4, 1)), ("predictions", (4, 3))):
        stable = np.linspace(0.1, 0.9, math.prod(shape)).reshape(shape).astype(np.float32)
        candidate = (stable + np.float32(0.5)).astype(np.float32)  # every example crosses 0.5 or moves by 0.5
        got = compare(answer({name: stable}), answer({name: candidate}))
        assert (got.pairs, got.classified, got.flips) == (4, 0, 0), name
        assert got.abs_diff == pytest.approx(0.5 * math.prod(shape), rel=1e-6), name
