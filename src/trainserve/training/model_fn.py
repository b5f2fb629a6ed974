"""`--model-fn`: your own Keras model, built by a function trainserve calls with a typed spec of the data.

    --model-fn path/to/file.py:build_model      a file, loaded by path
    --model-fn package.module:build_model       an importable module

`build_model(spec: DataSpec) -> keras.Model` is called under the strategy scope and the dtype policy in
force (mixed_float16 on recent GPUs: keep your last layer `dtype="float32"`). The model takes one input per
data input, named after it (`spec.keras_inputs()` makes them), and has one output: classification ->
probabilities [N, K] (softmax), or [N, 1] (sigmoid) for K = 2; regression -> [N, T] (or [N] for T = 1).
Returned compiled, its loss, optimizer and metrics are kept; uncompiled, trainserve compiles it with Adam
and the task's loss and metrics. The built-in `--architecture cnn|mlp` are two such functions.

Tabular data (a CSV) is preprocessed inside the model (training/preprocessing.py): the function gets one
input `features` float32 [F] and trainserve puts the preprocessing layers in front of what it returns. A
function with the attribute `raw_inputs = True` gets the raw columns instead (str categories, float32 numbers
with NaN for missing) and `spec.preprocessing` (vocabularies, means) to build its own.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trainserve.data import IMAGES, ImageFormat
from trainserve.errors import TrainserveError
from trainserve.task import Task
from trainserve.training.preprocessing import FEATURES, Preprocessing, plan_preprocessing

BUILTIN = {
    name: f"trainserve.training.{module}:{name}"
    for module, names in (
        ("builtin_models", ("auto", "cnn", "mlp")),
        ("transfer", ("mobilenet_v3_small", "efficientnet_b0", "resnet50")),
    )
    for name in names
}


@dataclass(frozen=True)
class InputSpec:
    """One input of the data: its name, the shape of one example, and its numpy dtype name."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def keras_dtype(self) -> str:
        """int64 for integer ids and counts (uint8 is image data: float32), string for text, float32 else."""
        if self.dtype == STRING:
            return STRING
        kind = np.dtype(self.dtype).kind
        return "int64" if kind in "iu" and self.dtype != "uint8" else "float32"

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


STRING = "string"  # the dtype name of text inputs (numpy's name for them varies with their width)


def dtype_name(array: np.ndarray) -> str:
    return STRING if array.dtype.kind in "USO" else array.dtype.name


@dataclass(frozen=True)
class DataSpec:
    """What `build_model(spec)` receives: the inputs, the task and a sample of training inputs."""

    inputs: tuple[InputSpec, ...]
    task: Task
    sample: dict[str, np.ndarray] = field(default_factory=dict, compare=False, repr=False)
    preprocessing: Preprocessing | None = None  # tabular data: what the layers in front of the model do
    image: ImageFormat | None = None  # image files: decoded (training/images.py) to uint8 `images` [H, W, C]

    def to_json(self) -> dict:
        """Everything but the sample (an .npz beside it)."""
        return {
            "inputs": [i.to_json() for i in self.inputs],
            "task": self.task.to_json(),
            "preprocessing": self.preprocessing.to_json() if self.preprocessing else None,
            "image": self.image.to_json() if self.image else None,
        }

    @classmethod
    def from_json(cls, raw: dict, sample: dict[str, np.ndarray]) -> DataSpec:
        inputs = tuple(InputSpec(i["name"], tuple(i["shape"]), i["dtype"]) for i in raw["inputs"])
        steps, image = raw.get("preprocessing"), raw.get("image")
        return cls(
            inputs,
            Task.from_json(raw["task"]),
            sample,
            Preprocessing.from_json(steps) if steps else None,
            ImageFormat.from_json(image) if image else None,
        )

    def features_spec(self) -> DataSpec:
        """What a model behind the preprocessing layers gets: `features` float32 [F], a sample of them."""
        assert self.preprocessing is not None
        sample = {FEATURES: self.preprocessing.features(self.sample)} if self.sample else {}
        spec = (InputSpec(FEATURES, (self.preprocessing.width,), "float32"),)
        return DataSpec(spec, self.task, sample, self.preprocessing)

    @property
    def names(self) -> list[str]:
        return [i.name for i in self.inputs]

    def keras_inputs(self) -> dict:
        """`keras.Input` per data input, named after it: `{name: KerasTensor}`."""
        import keras

        return {i.name: keras.Input(shape=i.shape, dtype=i.keras_dtype, name=i.name) for i in self.inputs}

    @property
    def output_units(self) -> int:
        """The width of the output a model for this task has by default (K classes or T targets)."""
        return self.task.classes if self.task.kind == "classification" else self.task.targets


def data_spec(
    inputs: dict[str, np.ndarray],
    task: Task,
    sample_size: int = 256,
    tabular: bool = False,
    image: ImageFormat | None = None,
) -> DataSpec:
    """The spec of the training inputs; `tabular` (a CSV's columns): with the preprocessing they need;
    `image` (image files): the model takes their decoded pixels, uint8 `images` [H, W, C]."""
    if image is not None:
        return DataSpec((InputSpec(IMAGES, (image.height, image.width, image.channels), "uint8"),), task, image=image)
    specs = tuple(InputSpec(k, tuple(int(d) for d in v.shape[1:]), dtype_name(v)) for k, v in inputs.items())
    preprocessing = plan_preprocessing(inputs) if tabular else None
    return DataSpec(specs, task, {k: v[:sample_size] for k, v in inputs.items()}, preprocessing)


def wants_raw_inputs(function: Callable) -> bool:
    return bool(getattr(function, "raw_inputs", False))


def resolve(reference: str) -> Callable:
    """The function `reference` names (`file.py:fn`, `package.module:fn`, or a built-in's name)."""
    reference = BUILTIN.get(reference, reference)
    where, sep, name = reference.rpartition(":")
    if not sep or not where or not name:
        raise TrainserveError(f"--model-fn {reference!r}: expected path/to/file.py:function or package.module:function")
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise TrainserveError(f"--model-fn {reference!r}: file {path} not found: expected a Python file")
        module_name = f"trainserve_user_model_{abs(hash(str(path.resolve())))}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        _run_module(lambda: spec.loader.exec_module(module), reference)
    else:
        try:
            module = _run_module(lambda: importlib.import_module(where), reference)
        except ModuleNotFoundError as exc:
            raise TrainserveError(
                f"--model-fn {reference!r}: module {exc.name!r} not found: expected an importable module"
            ) from None
    function = getattr(module, name, None)
    if not callable(function):
        raise TrainserveError(f"--model-fn {reference!r}: {where} has no function {name!r}: expected def {name}(spec)")
    return function


def _run_module(load, reference: str):
    try:
        return load()
    except ModuleNotFoundError:
        raise
    except Exception as exc:
        raise TrainserveError(f"--model-fn {reference!r}: loading it failed: {type(exc).__name__}: {exc}") from None


def build(reference: str, spec: DataSpec, function: Callable | None = None):
    """Call the model function and check what it returns against the data. `function`: `reference` already
    resolved (resolving a file runs the user's code, which should happen once)."""
    import keras

    function = function or resolve(reference)
    try:
        model = function(spec)
    except TrainserveError:
        raise
    except Exception as exc:
        raise TrainserveError(f"--model-fn {reference!r} raised {type(exc).__name__}: {exc}") from None
    if not isinstance(model, keras.Model):
        raise TrainserveError(f"--model-fn {reference!r} returned {type(model).__name__}: expected a keras.Model")
    check_model(model, spec, reference)
    return model


def check_model(model, spec: DataSpec, reference: str) -> None:
    """Input names equal to the data's; one output whose width fits the task."""
    names = sorted(getattr(t, "name", "?") for t in model.inputs)
    if names != sorted(spec.names):
        raise TrainserveError(
            f"--model-fn {reference!r}: model inputs {names} do not match the data's inputs {sorted(spec.names)}:"
            " expected keras.Input(name=...) per data input (spec.keras_inputs())"
        )
    if len(model.outputs) != 1:
        raise TrainserveError(f"--model-fn {reference!r}: model has {len(model.outputs)} outputs: expected one")
    shape = tuple(model.outputs[0].shape)
    units = shape[-1] if len(shape) == 2 else 1 if len(shape) == 1 else None
    task = spec.task
    allowed = {spec.output_units} | ({1} if task.kind == "classification" and task.classes == 2 else set())
    if units not in allowed:
        want = (
            f"[N, {task.classes}] probabilities" + (" or [N, 1] sigmoid" if task.classes == 2 else "")
            if task.kind == "classification"
            else f"[N, {task.targets}] predictions"
        )
        raise TrainserveError(f"--model-fn {reference!r}: model output is {list(shape)}: expected {want}")


def input_structure(model) -> Callable[[dict], object]:
    """How `model` wants its inputs, from a dict of named inputs: the dict itself (a model built on a dict),
    a list in the model's order, or the one tensor of a single-input model (Keras warns on a mismatch)."""
    struct = getattr(model, "_inputs_struct", None)
    if isinstance(struct, dict) or struct is None:
        return lambda inputs: inputs
    names = [t.name for t in model.inputs]
    if isinstance(struct, list | tuple):  # a tuple: tf.data would stack a list into one tensor
        return lambda inputs: tuple(inputs[name] for name in names)
    return lambda inputs: inputs[names[0]]
