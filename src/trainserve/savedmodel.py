"""Load and run a SavedModel the way tensorflow_model_server does.

TF Serving loads tag `serve` into a TF1-style session (SavedModelBundle) and runs a SignatureDef by
feeding and fetching its tensor names, with soft placement off: a node pinned to a GPU that is not there
fails the load or the run. The CPU gate and serve-local both go through here, so a model that would
fail in TF Serving fails here too.

TensorFlow is imported inside the functions that need it: the eval client imports this module for
TensorSpecInfo and tensor_info (TensorFlow-free); only running a model (serve-local, the gate,
eval --compare-local) needs TensorFlow.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainserve.errors import TrainserveError, first_line
from trainserve.tensors import numpy_dtype

SERVE_TAG = "serve"


class UnknownSignature(TrainserveError):
    """The SignatureDef a request names is not in the model."""


class RunError(TrainserveError):
    """TensorFlow failed while running a signature: the first line of its message and its canonical error
    code (tensorflow/core/protobuf/error_codes.proto; the same numbers as gRPC's status codes)."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def saved_model_pb(version_dir: Path) -> Path:
    """The directory's `saved_model.pb`; a clear error, without TensorFlow, when there is none."""
    pb = Path(version_dir) / "saved_model.pb"
    if not pb.is_file():
        raise TrainserveError(f"{version_dir} is not a SavedModel: expected {pb.name} inside it")
    return pb


def saved_model_proto(version_dir: Path):
    """The parsed `saved_model.pb`; a clear error when the directory is not a SavedModel."""
    from google.protobuf.message import DecodeError
    from tensorflow.core.protobuf import saved_model_pb2

    pb = saved_model_pb(version_dir)
    proto = saved_model_pb2.SavedModel()
    try:
        proto.ParseFromString(pb.read_bytes())
    except DecodeError as exc:
        raise TrainserveError(f"{pb} is corrupt ({exc}): expected a serialized SavedModel proto") from None
    if not proto.meta_graphs:
        raise TrainserveError(f"{pb} holds no MetaGraph: expected one tagged {SERVE_TAG!r}")
    return proto


def serve_meta_graph(version_dir: Path):
    """The MetaGraphDef tagged `serve`, as TF Serving picks it."""
    proto = saved_model_proto(version_dir)
    for meta_graph in proto.meta_graphs:
        if SERVE_TAG in meta_graph.meta_info_def.tags:
            return meta_graph
    tags = [list(m.meta_info_def.tags) for m in proto.meta_graphs]
    raise TrainserveError(f"{version_dir}: no MetaGraph tagged {SERVE_TAG!r} (found tags {tags})")


def gpu_pinned_nodes(version_dir: Path) -> list[str]:
    """Nodes whose device names a GPU, in the graph and in every function body (where Keras puts them)."""
    meta_graph = serve_meta_graph(version_dir)
    graph = meta_graph.graph_def
    pinned = [f"{n.name} ({n.device})" for n in graph.node if "GPU" in n.device.upper()]
    for function in graph.library.function:
        pinned += [
            f"{function.signature.name}/{n.name} ({n.device})" for n in function.node_def if "GPU" in n.device.upper()
        ]
    return pinned


@dataclass(frozen=True)
class TensorSpecInfo:
    """One signature input or output: its graph tensor, dtype and shape (None = any size)."""

    key: str
    tensor: str
    dtype: np.dtype
    shape: tuple[int | None, ...] | None

    def accepts(self, array: np.ndarray) -> bool:
        if self.shape is None:
            return True
        return len(self.shape) == array.ndim and all(d is None or d == a for d, a in zip(self.shape, array.shape))

    def describe(self) -> str:
        dims = "?" if self.shape is None else "[" + ", ".join("None" if d is None else str(d) for d in self.shape) + "]"
        return f"{self.dtype.name} {dims}"


def tensor_info(key: str, info) -> TensorSpecInfo:
    """A SignatureDef's TensorInfo (TensorFlow's message or trainserve.protos') as a TensorSpecInfo.

    TensorFlow-free for every dtype trainserve sends or decodes, so the eval client can call it; other
    dtypes (bfloat16, complex, resource) take TensorFlow's mapping, so serve-local still loads such models.
    """
    try:
        dtype = numpy_dtype(info.dtype)
    except TrainserveError:
        import tensorflow as tf

        dtype = np.dtype(tf.dtypes.as_dtype(info.dtype).as_numpy_dtype)
    shape = None
    if not info.tensor_shape.unknown_rank:
        shape = tuple(None if d.size < 0 else int(d.size) for d in info.tensor_shape.dim)
    return TensorSpecInfo(key, info.name, dtype, shape)


def op_error_message(exc: Exception) -> str:
    """The failed op's own message, as TF Serving returns it, without what the Python session adds around it
    ("Graph execution error:", "Detected at node ... defined at" and the Python stack of the node)."""
    lines = [line for line in str(getattr(exc, "message", exc)).splitlines() if line.strip()]
    for i, line in enumerate(lines[:-1]):
        if line.startswith("Node: "):
            return lines[i + 1].strip()
    kept = [line for line in lines if not line.startswith(("Graph execution error", "Detected at node", " "))]
    return kept[0].strip() if kept else first_line(exc)


def require_tensorflow(what: str) -> None:
    """One line instead of an ImportError where TensorFlow is missing: the core install is the eval client."""
    import importlib.util

    if importlib.util.find_spec("tensorflow") is None:
        raise TrainserveError(
            f"{what} needs TensorFlow, which this install lacks (the core install is the TensorFlow-free eval "
            "client): pip install 'trainserve[serve]'"
        )


class LoadedModel:
    """One SavedModel version in its own graph and session, ready to run any of its signatures."""

    def __init__(self, version_dir: Path, intra_op_threads: int = 0, inter_op_threads: int = 0):
        require_tensorflow(f"running {version_dir} in-process")
        import tensorflow as tf

        self.path = Path(version_dir)
        serve_meta_graph(self.path)  # clear errors before TF's own
        config = tf.compat.v1.ConfigProto(
            allow_soft_placement=False,
            device_count={"GPU": 0},
            intra_op_parallelism_threads=intra_op_threads,
            inter_op_parallelism_threads=inter_op_threads,
        )
        self.graph = tf.Graph()
        self.session = tf.compat.v1.Session(graph=self.graph, config=config)
        try:
            with self.graph.as_default():
                meta_graph = tf.compat.v1.saved_model.loader.load(self.session, [SERVE_TAG], str(self.path))
        except Exception as exc:  # TF raises many types; all mean "TF Serving would refuse this too"
            self.session.close()
            raise TrainserveError(f"{self.path} does not load on CPU: {first_line(exc)}") from None
        self.signature_defs = dict(meta_graph.signature_def)
        self.signatures = {
            name: (
                {k: tensor_info(k, v) for k, v in sig.inputs.items()},
                {k: tensor_info(k, v) for k, v in sig.outputs.items()},
            )
            for name, sig in self.signature_defs.items()
            if not name.startswith("__")  # __saved_model_init_op: TF's own, not callable by clients
        }

    @functools.cached_property
    def signature_def_map(self):
        """The SignatureDefs as trainserve.protos' SignatureDefMap (what GetModelMetadata packs), built once per
        loaded version. The loader gives TensorFlow's classes: same fields, so they cross as bytes."""
        from trainserve.protos import get_model_metadata_pb2

        signature_map = get_model_metadata_pb2.SignatureDefMap()
        for name, signature in self.signature_defs.items():
            signature_map.signature_def[name].ParseFromString(signature.SerializeToString())
        return signature_map

    def signature(self, name: str):
        if name not in self.signatures:
            raise UnknownSignature(
                f"signature {name!r} not found in {self.path}: expected one of {', '.join(sorted(self.signatures))}"
            )
        return self.signatures[name]

    def check_inputs(self, name: str, inputs: dict[str, np.ndarray]) -> None:
        """TF Serving's checks: exactly the signature's input keys, right dtypes, compatible shapes."""
        wanted, _ = self.signature(name)
        missing = sorted(set(wanted) - set(inputs))
        extra = sorted(set(inputs) - set(wanted))
        if missing or extra:
            raise TrainserveError(
                f"signature {name!r} expects inputs {sorted(wanted)}"
                + (f"; missing {missing}" if missing else "")
                + (f"; unknown {extra}" if extra else "")
            )
        for key, spec in wanted.items():
            array = inputs[key]
            if array.dtype != spec.dtype:
                raise TrainserveError(f"input {key!r} is {array.dtype.name}: expected {spec.dtype.name}")
            if not spec.accepts(array):
                raise TrainserveError(f"input {key!r} has shape {list(array.shape)}: expected {spec.describe()}")

    def run(
        self, name: str, inputs: dict[str, np.ndarray], output_filter: list[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Run signature `name`; returns the requested outputs (all when no filter) as numpy arrays."""
        self.check_inputs(name, inputs)
        wanted, outputs = self.signature(name)
        keys = list(output_filter) if output_filter else sorted(outputs)
        unknown = [k for k in keys if k not in outputs]
        if unknown:
            raise TrainserveError(f"output_filter {unknown} not in signature {name!r}: expected {sorted(outputs)}")
        feed = {wanted[k].tensor: v for k, v in inputs.items()}
        try:
            fetched = self.session.run([outputs[k].tensor for k in keys], feed_dict=feed)
        except Exception as exc:
            code = getattr(exc, "error_code", None)  # tf.errors.OpError's; TensorFlow is imported lazily here
            if code is None:
                raise
            raise RunError(f"signature {name!r} failed: {op_error_message(exc)}", code) from None
        return dict(zip(keys, (np.asarray(v) for v in fetched)))

    def close(self) -> None:
        self.session.close()
