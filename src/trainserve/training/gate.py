"""The CPU gate: would TF Serving on a CPU load and answer this SavedModel, with the trained numbers?

It must run where no GPU is visible: a process with GPUs has kernels and placements a CPU server will
not have. Training with no GPU calls `check_on_cpu` in process; otherwise the export's child process
(CUDA_VISIBLE_DEVICES=-1) calls it, and `run_gate` starts such a process for any SavedModel. It:
1. finds any node pinned to a GPU, function bodies included;
2. loads tag `serve` into a session with soft placement off (as TF Serving does);
3. runs a golden batch and compares with the training process's outputs, or, for a SavedModel made
   elsewhere, replays its warmup requests (or zeros shaped like its inputs) and checks they run.

`python -m trainserve.training.gate VERSION_DIR [--golden FILE --atol X]` prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from trainserve.errors import TrainserveError

FLOAT32_ATOL = 1e-4
MIXED_PRECISION_ATOL = 1e-2


@dataclass
class GateResult:
    ok: bool
    reason: str = ""
    checked: str = ""
    max_abs_diff: float | None = None
    signatures: list[str] = field(default_factory=list)


@dataclass
class GoldenBatch:
    """Held-out inputs and the trained model's outputs for them: what the exported version must reproduce."""

    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]

    def save(self, path: Path) -> Path:
        """Store as `in:<name>` inputs and `out:<name>` outputs, for a gate in another process."""
        arrays = {f"in:{k}": v for k, v in self.inputs.items()} | {f"out:{k}": v for k, v in self.outputs.items()}
        stored = {}
        for key, value in arrays.items():
            stored.update(_packed_strings(key, value) if value.dtype.kind in "OUS" else {key: value})
        np.savez(path, **stored)
        return path

    @classmethod
    def load(cls, path: Path) -> GoldenBatch:
        with np.load(path) as npz:
            packed = {k.removesuffix(STRING_PARTS[0]) for k in npz.files if k.endswith(STRING_PARTS[0])}
            arrays = {k: npz[k] for k in npz.files if k.partition("#")[0] not in packed}
            arrays.update({key: _unpacked_strings(key, npz) for key in packed})
        inputs = {k[3:]: v for k, v in arrays.items() if k.startswith("in:")}
        return cls(inputs, {k[4:]: strings_as_objects(v) for k, v in arrays.items() if k.startswith("out:")})


# Text and bytes (string inputs and outputs, image files) stored as one byte blob plus each value's length: an
# object array needs pickle, and numpy's fixed-width bytes drop a value's trailing NUL bytes (a BMP's padding).
STRING_PARTS = ("#blob", "#lengths", "#shape")


def _packed_strings(key: str, array: np.ndarray) -> dict[str, np.ndarray]:
    values = [v if isinstance(v, bytes) else str(v).encode() for v in array.ravel()]
    blob = np.frombuffer(b"".join(values), np.uint8)
    lengths, shape = np.array([len(v) for v in values], np.int64), np.array(array.shape, np.int64)
    return {key + part: part_array for part, part_array in zip(STRING_PARTS, (blob, lengths, shape))}


def _unpacked_strings(key: str, npz) -> np.ndarray:
    blob, lengths, shape = (npz[key + part] for part in STRING_PARTS)
    ends = np.cumsum(lengths)
    values = [blob[end - n : end].tobytes() for end, n in zip(ends, lengths)]
    return np.array(values, dtype=object).reshape(tuple(shape))


def strings_as_objects(array: np.ndarray) -> np.ndarray:
    """Text (str or stored bytes) as the object array of bytes a session takes and answers for DT_STRING."""
    if array.dtype.kind == "U":
        return np.array([v.encode() for v in array.ravel()], dtype=object).reshape(array.shape)
    return array.astype(object) if array.dtype.kind == "S" else array


def check_on_cpu(version_dir: Path, golden: GoldenBatch | None = None, atol: float = FLOAT32_ATOL) -> GateResult:
    """The gate itself; call it in a process that sees no GPU (see `run_gate`)."""
    from trainserve.layout import DEFAULT_SIGNATURE, read_warmup_inputs
    from trainserve.savedmodel import LoadedModel, gpu_pinned_nodes

    try:
        pinned = gpu_pinned_nodes(version_dir)
        if pinned:
            more = f" and {len(pinned) - 3} more" if len(pinned) > 3 else ""
            return GateResult(False, f"{len(pinned)} node(s) pinned to a GPU: {', '.join(pinned[:3])}{more}")
        model = LoadedModel(version_dir)
        signatures = sorted(model.signatures)
        if golden is not None:
            inputs = {k: strings_as_objects(v) for k, v in golden.inputs.items()}  # a CSV's text columns
            got = model.run(DEFAULT_SIGNATURE, inputs, list(golden.outputs))
            return _compare(golden.outputs, got, atol, signatures)
        requests = read_warmup_inputs(version_dir)
        checked = "warmup requests"
        if not requests:
            checked = "zeros shaped like the inputs"
            name = DEFAULT_SIGNATURE if DEFAULT_SIGNATURE in model.signatures else signatures[0]
            wanted, _ = model.signature(name)
            requests = [(name, {k: _zeros_like(spec) for k, spec in wanted.items()})]
        for name, inputs in requests:
            for key, value in model.run(name, inputs).items():
                if value.dtype.kind == "f" and not np.all(np.isfinite(value)):
                    return GateResult(False, f"signature {name!r} output {key!r} is not finite", checked)
        return GateResult(True, "", f"{len(requests)} {checked}", None, signatures)
    except TrainserveError as exc:
        return GateResult(False, str(exc))


def _zeros_like(spec) -> np.ndarray:
    shape = [1 if d is None else d for d in (spec.shape or (1,))]
    return np.zeros(shape, spec.dtype if spec.dtype != np.object_ else np.bytes_)


def _compare(expected: dict, got: dict, atol: float, signatures: list[str]) -> GateResult:
    worst = 0.0
    for key, want in expected.items():
        have = got[key]
        if have.shape != want.shape:
            return GateResult(False, f"output {key!r} has shape {have.shape}: expected {want.shape}")
        if want.dtype.kind == "f":
            diff = float(np.max(np.abs(have.astype(np.float64) - want.astype(np.float64)), initial=0.0))
            worst = max(worst, diff)
            if not diff <= atol:
                return GateResult(False, f"output {key!r} differs by {diff:.3g}: expected <= {atol:g}", "golden", diff)
        elif not np.array_equal(have, want):
            changed = int(np.sum(have != want))
            return GateResult(False, f"output {key!r} differs in {changed} of {want.size} entries: expected identical")
    return GateResult(True, "", f"golden batch of {len(next(iter(expected.values())))}", worst, signatures)


def run_gate(version_dir: Path, golden: GoldenBatch | None = None, atol: float = FLOAT32_ATOL) -> GateResult:
    """`check_on_cpu` where no GPU is visible: in this process when TensorFlow has not started yet (it then
    starts with CUDA_VISIBLE_DEVICES=-1), else in a fresh process that sees none (this one's may see GPUs)."""
    if "tensorflow" not in sys.modules:
        os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
        return check_on_cpu(version_dir, golden, atol)
    with tempfile.TemporaryDirectory() as tmp:
        command = ["-m", "trainserve.training.gate", str(version_dir), "--atol", str(atol)]
        if golden is not None:
            command += ["--golden", str(golden.save(Path(tmp) / "golden.npz"))]
        proc = run_without_gpu(command)
    return result_from_output(proc)


def run_without_gpu(args: list[str]) -> subprocess.CompletedProcess:
    """`python ARGS` in a child process that sees no GPU (and says little on stderr)."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="-1", TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True)


def result_from_output(proc: subprocess.CompletedProcess) -> GateResult:
    """The GateResult a child printed as its last JSON line; a failure naming stderr's last line if none."""
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return GateResult(False, f"CPU gate process failed (exit {proc.returncode}): {tail}")
    return GateResult(**json.loads(lines[-1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainserve.training.gate", description=__doc__.splitlines()[0])
    parser.add_argument("version_dir", type=Path)
    parser.add_argument("--golden", type=Path)
    parser.add_argument("--atol", type=float, default=FLOAT32_ATOL)
    args = parser.parse_args(argv)
    golden = GoldenBatch.load(args.golden) if args.golden else None
    result = check_on_cpu(args.version_dir, golden, args.atol)
    print(json.dumps(asdict(result)), flush=True)
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
