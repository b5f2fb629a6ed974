"""A TensorFlow-free client of TF Serving's gRPC API (real TF Serving or serve-local), shared by every stage that
talks to a server: eval, load, rollout and the benchmarks.

Module order: channel (how to reach the server: one function that builds the gRPC channel, over TLS with the
credentials of trainserve.tls) -> refusal (one line naming why a server refused the connection) ->
target (which model, version or label, and signature a request names) -> status (GetModelStatus for versions,
GetModelMetadata for labels, and the one loop that waits on them) -> signature (a version's SignatureDef) ->
predict (pinned Predict with retries and backoff) -> connection (ServingClient: one channel, all of the above).

It imports grpc, numpy and trainserve.protos, never TensorFlow or a stage (tests/test_architecture.py and
tests/test_light_client.py check both), so a client starts in a fraction of a second.
"""

from __future__ import annotations

from trainserve.client.channel import open_channel
from trainserve.client.connection import ServingClient
from trainserve.client.predict import Prediction, backoff_delay
from trainserve.client.refusal import describe_refusal
from trainserve.client.signature import Signature
from trainserve.client.target import RequestFailed, Target

__all__ = [
    "Prediction",
    "RequestFailed",
    "ServingClient",
    "Signature",
    "Target",
    "backoff_delay",
    "describe_refusal",
    "open_channel",
]
