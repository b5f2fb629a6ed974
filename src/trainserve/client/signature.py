"""A served version's SignatureDef, read with GetModelMetadata as TF Serving packs it."""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from trainserve.client.target import RequestFailed, Target, rpc_status
from trainserve.errors import TrainserveError
from trainserve.protos import get_model_metadata_pb2
from trainserve.savedmodel import TensorSpecInfo, tensor_info


@dataclass(frozen=True)
class Signature:
    """A SignatureDef's input and output tensors, by key."""

    inputs: dict[str, TensorSpecInfo]
    outputs: dict[str, TensorSpecInfo]


def read_signature(prediction, target: Target, version: int | None, timeout: float) -> Signature:
    """The target's signature in `version` (None: the target's own version, pinned, labelled or the newest)."""
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    target.fill(request.model_spec, version)
    request.model_spec.ClearField("signature_name")
    try:
        response = prediction.GetModelMetadata(request, timeout=timeout)
    except grpc.RpcError as exc:
        raise RequestFailed(f"GetModelMetadata for {target.describe()}: {rpc_status(exc)}", exc.code()) from None
    asked = target.describe() if version is None else f"{target.describe()} version {version}"
    defs = _signature_defs(response, asked)
    if target.signature not in defs:
        names = sorted(k for k in defs if not k.startswith("__"))
        raise TrainserveError(
            f"signature {target.signature!r} not found in {asked}: expected one of {', '.join(names)}"
        )
    sig = defs[target.signature]
    return Signature(
        {k: tensor_info(k, v) for k, v in sig.inputs.items()},
        {k: tensor_info(k, v) for k, v in sig.outputs.items()},
    )


def _signature_defs(response, asked: str):
    """The SignatureDefMap TF Serving packs in an Any under "signature_def", checked by its type name."""
    packed = response.metadata.get("signature_def")
    wanted = get_model_metadata_pb2.SignatureDefMap.DESCRIPTOR.full_name
    if packed is None or packed.type_url.rpartition("/")[2] != wanted:
        got = "nothing" if packed is None else repr(packed.type_url)
        raise TrainserveError(f"GetModelMetadata for {asked} answered {got} under 'signature_def': expected a {wanted}")
    return get_model_metadata_pb2.SignatureDefMap.FromString(packed.value).signature_def
