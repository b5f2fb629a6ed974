"""How the data meets the served signature, settled before the first Predict.

Inputs are matched by name (`--input-map key=input` where the data and the signature name them
differently; one unnamed input meets a one-input signature), each checked for dtype and shape. The task
comes from `--task`, else the shared split (our own models), else the labels' dtype: integers are
classes, floats are regression targets. The output is `--output`, else the one trainserve exports for
the task (`probabilities`, `predictions`), else the signature's only float output.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from trainserve.client import ServingClient, Signature, Target
from trainserve.errors import TrainserveError
from trainserve.evaluation.config import TaskChoice
from trainserve.evaluation.data import Column, EvalData, encode_labels
from trainserve.layout import CLASSES, LABEL_NAMES, PREDICTIONS, PROBABILITIES, UNKNOWN_CATEGORIES
from trainserve.task import Task


@dataclass(frozen=True)
class Feed:
    """One signature input, fed from the data's column `key` (`add_axis`: [N, ...] -> [N, ..., 1]); a text
    column (a CSV's) is converted to `convert` (the signature's dtype: strings as UTF-8 bytes, numbers parsed
    with an empty cell as NaN)."""

    key: str
    input: str
    add_axis: bool = False
    convert: np.dtype | None = None

    def take(self, columns: dict[str, np.ndarray]) -> np.ndarray:
        array = columns[self.key]
        if self.convert is not None:
            array = text_as(array, self.convert, self.key)
        return array[..., np.newaxis] if self.add_axis else array


def text_as(array: np.ndarray, dtype: np.dtype, key: str) -> np.ndarray:
    if dtype == np.dtype(object):
        return np.array([v.encode() for v in array.ravel()], dtype=object).reshape(array.shape)
    try:
        return np.where(array == "", "nan", array).astype(dtype)
    except ValueError as exc:
        raise TrainserveError(f"the data's {key!r} holds text that is not a {dtype.name} ({exc})") from None


@dataclass(frozen=True)
class Plan:
    """What each request sends and which output answers it, for which task."""

    feeds: tuple[Feed, ...]
    task: Task
    output: str
    classes_output: str | None = None  # an integer `classes` output served beside the probabilities
    unknown_output: str | None = None  # trainserve's count of category values training never saw

    @property
    def output_filter(self) -> list[str]:
        extra = [o for o in (self.classes_output, self.unknown_output) if o]
        return [self.output, *extra]

    def request_inputs(self, columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {feed.input: feed.take(columns) for feed in self.feeds}


def plan_requests(
    signature: Signature,
    data: EvalData,
    target: Target,
    task: TaskChoice = "auto",
    output: str | None = None,
    input_map: dict[str, str] | None = None,
) -> tuple[Plan, EvalData]:
    """The plan, and the data with its labels in the task's form (int64 [N] or float32 [N, T])."""
    where = f"signature {target.signature!r} of {target.describe()}"
    feeds = map_inputs(signature, data, input_map or {}, where)
    kind = _task_kind(task, data)
    chosen = choose_output(signature, kind, output, where)
    labels = _labels_for(kind, data.labels, data.name)
    resolved = _task(kind, signature.outputs[chosen].shape, labels, data, where)
    classes = CLASSES if kind == "classification" and _is_int_output(signature, CLASSES) else None
    unknown = UNKNOWN_CATEGORIES if _is_int_output(signature, UNKNOWN_CATEGORIES) else None
    return Plan(feeds, resolved, chosen, classes, unknown), replace(data, labels=labels, task=resolved)


def with_class_ids(
    client: ServingClient,
    target: Target,
    signature: Signature,
    data: EvalData,
    input_map: dict[str, str],
    retries: int,
    version: int | None = None,
) -> EvalData:
    """Labels that are class names (a CSV's) become the model's class ids, in the order of the model's own
    `label_names` output, asked of `version` (None: the target's) for one example; a name the model lacks is an
    error before the run."""
    if data.labels.dtype.kind != "U" or not data.count:
        return data
    where = f"signature {target.signature!r} of {target.describe()}"
    if LABEL_NAMES not in signature.outputs:
        raise TrainserveError(
            f"{data.name}: the labels are names ({', '.join(sorted(set(data.labels[:3].tolist())))}...) but {where}"
            f" does not name its classes (no {LABEL_NAMES!r} output): expected integer class ids"
        )
    feeds = map_inputs(signature, data, input_map, where)
    columns, _ = next(data.batches(1))
    inputs = {feed.input: feed.take(columns) for feed in feeds}
    answer = client.predict(target, inputs, [LABEL_NAMES], version, retries)
    names = [v.decode() if isinstance(v, bytes) else str(v) for v in answer.outputs[LABEL_NAMES][0]]
    return encode_labels(data, names, target.describe())


def map_inputs(signature: Signature, data: EvalData, input_map: dict[str, str], where: str) -> tuple[Feed, ...]:
    """Every signature input gets a data column of its dtype and shape, or a one-line error says which not."""
    for key, name in input_map.items():
        if name not in signature.inputs:
            raise TrainserveError(
                f"--input-map {key}={name}: {where} has no input {name!r}: expected one of {_names(signature.inputs)}"
            )
        if key not in data.columns:
            raise TrainserveError(
                f"--input-map {key}={name}: the data has no {key!r}: expected one of {_names(data.columns)}"
            )
    by_input = {name: key for key, name in input_map.items()}
    for name in signature.inputs:
        if name not in by_input and name in data.columns:
            by_input[name] = name
    if not by_input and len(signature.inputs) == 1 and len(data.columns) == 1:
        by_input[next(iter(signature.inputs))] = next(iter(data.columns))  # one input each: names do not matter
    missing = [name for name in signature.inputs if name not in by_input]
    if missing:
        raise TrainserveError(
            f"the data lacks input {', '.join(map(repr, missing))} of {where}: the data has {_names(data.columns)}; "
            "expected a column of that name, or --input-map KEY=INPUT"
        )
    return tuple(_feed(data.columns[by_input[name]], signature, name, where) for name in signature.inputs)


def _feed(column: Column, signature: Signature, name: str, where: str) -> Feed:
    spec = signature.inputs[name]
    text = column.dtype.kind == "U" and spec.dtype != column.dtype  # a CSV's text: converted to what it takes
    if column.dtype != spec.dtype and not text:
        raise TrainserveError(
            f"{where} wants {name!r} as {spec.dtype.name}; the data's {column.key!r} is {column.dtype.name}: "
            "expected the same dtype"
        )
    for add_axis in (False, True):
        shape = (1, *column.shape) + ((1,) if add_axis else ())
        if spec.accepts(np.empty(shape, spec.dtype)):
            return Feed(column.key, name, add_axis, spec.dtype if text else None)
    raise TrainserveError(
        f"{where} wants {name!r} shaped {spec.describe()}; the data's {column.key!r} examples are "
        f"{list(column.shape)}: expected the same shape"
    )


def expected_kind(task: TaskChoice, data: EvalData) -> str:
    """The task the plan will settle on, told before any request: class names (a CSV's text labels) are
    classification too."""
    if task == "auto" and data.task is None and data.labels.dtype.kind == "U":
        return "classification"
    return _task_kind(task, data)


def _task_kind(task: TaskChoice, data: EvalData) -> str:
    if task != "auto":
        return task
    if data.task is not None:
        return data.task.kind
    if data.labels.dtype.kind in "biu":
        return "classification"
    if data.labels.dtype.kind == "f":
        return "regression"
    raise TrainserveError(
        f"{data.name}: labels are {data.labels.dtype}: expected integer labels (classification) or floats (regression)"
    )


def choose_output(signature: Signature, kind: str, output: str | None, where: str) -> str:
    """`--output`, else trainserve's name for the task, else the only float output."""
    outputs = signature.outputs
    if output is not None and output not in outputs:
        raise TrainserveError(f"--output {output}: {where} has no such output: expected one of {_names(outputs)}")
    if output is None:
        preferred = PROBABILITIES if kind == "classification" else PREDICTIONS
        floats = [k for k, s in outputs.items() if s.dtype.kind == "f"]
        output = preferred if preferred in outputs else (floats[0] if len(floats) == 1 else None)
        if output is None:
            raise TrainserveError(
                f"{where} has outputs {_names(outputs)} and none is the {kind} output: expected --output NAME"
            )
    spec = outputs[output]
    if spec.dtype.kind != "f" or (spec.shape is not None and len(spec.shape) not in (1, 2)):
        raise TrainserveError(
            f"output {output!r} of {where} is {spec.dtype.name} {spec.describe()}: expected float [N] or [N, K] "
            f"for {kind}"
        )
    return output


def _labels_for(kind: str, labels: np.ndarray, name: str) -> np.ndarray:
    """int64 [N] class ids, or float32 [N, T] targets; labels that fit neither are refused here."""
    if labels.ndim == 2 and labels.shape[1] == 1 and kind == "classification":
        labels = labels[:, 0]
    if kind == "classification":
        if labels.dtype.kind not in "biu" or labels.ndim != 1 or labels.min(initial=0) < 0:
            raise TrainserveError(
                f"{name}: labels are {labels.dtype} {list(labels.shape)}: expected integer class ids >= 0, [N], "
                "for classification (--task regression for numeric targets)"
            )
        return labels.astype(np.int64)
    if labels.dtype.kind not in "biuf" or labels.ndim not in (1, 2) or not np.all(np.isfinite(labels)):
        raise TrainserveError(
            f"{name}: labels are {labels.dtype} {list(labels.shape)}: expected finite numbers [N] or [N, T] "
            "for regression"
        )
    return (labels[:, np.newaxis] if labels.ndim == 1 else labels).astype(np.float32)


def _task(kind: str, shape, labels: np.ndarray, data: EvalData, where: str) -> Task:
    """The Task with its width, checked against the output's last dimension where the signature fixes it."""
    per_example = None if shape is None else (1 if len(shape) == 1 else shape[-1])  # None: not fixed
    if kind == "regression":
        targets = labels.shape[1]
        if per_example is not None and per_example != targets:
            raise TrainserveError(
                f"the labels have {targets} targets but {where} outputs {per_example} per example: expected the same"
            )
        return Task("regression", targets=targets)
    names = data.label_names or (list(data.task.label_names) if data.task else [])
    # One score per example is class 1's probability (or logit); an unfixed width comes from the data.
    classes = 2 if per_example == 1 else per_example or max(len(names), int(labels.max(initial=1)) + 1)
    if labels.size and int(labels.max()) >= classes:
        raise TrainserveError(
            f"the data has label {int(labels.max())} but {where} outputs {classes} classes: expected labels < {classes}"
        )
    if names and len(names) != classes:
        raise TrainserveError(f"the data names {len(names)} classes but {where} outputs {classes}: expected the same")
    return Task("classification", classes=classes, label_names=tuple(names or (str(i) for i in range(classes))))


def _is_int_output(signature: Signature, name: str) -> bool:
    spec = signature.outputs.get(name)
    return spec is not None and spec.dtype.kind in "iu"


def _names(keys) -> str:
    return ", ".join(sorted(keys)) or "none"
