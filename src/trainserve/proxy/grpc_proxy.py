"""The gRPC side of `trainserve proxy`: TF Serving's PredictionService and ModelService (and grpc.health.v1's
Check) forwarded as bytes on grpc.aio, nothing decoded or re-encoded on the way. The client's deadline travels
as the upstream call's timeout, its metadata with it; TF Serving's status code, details and trailing metadata come
back as they were. A sampled Predict is handed to the capture after its answer is on its way; one that carries
`x-trainserve-origin` (trainserve's own replay, eval or load) is forwarded and counted, never recorded. A call that
finds TF Serving unreachable waits up to `--upstream-wait` for it, and each that still fails is counted and logged
(trainserve.proxy.upstream). A request for a model the routing file routes that names neither a version nor a
label is sent as a `stable` request (its model_spec rewritten to the label), as TF Serving would otherwise answer it
with its highest version, the candidate once staged (trainserve.proxy.router)."""

from __future__ import annotations

import asyncio
import time

import grpc

from trainserve.proxy.proxy_metrics import ProxyMetrics
from trainserve.proxy.router import CANARY, PASS, Decision, Router
from trainserve.proxy.routing import STABLE_LABEL
from trainserve.proxy.sampling import ProxyCapture
from trainserve.proxy.upstream import GRPC, UpstreamLog, reconnect_options, wait_reachable
from trainserve.proxy.wire import WireError, answered_version, request_spec, with_label, with_version
from trainserve.traffic.origin import origin_of

FORWARDED = ("/tensorflow.serving.PredictionService/", "/tensorflow.serving.ModelService/", "/grpc.health.v1.Health/")
STREAMING = ("/grpc.health.v1.Health/Watch",)  # forwarded methods are unary; this one streams
PREDICT = "/tensorflow.serving.PredictionService/Predict"
# Calls whose request carries model_spec as field 1 and answer as field 2: routed and counted by version.
ROUTED = {
    PREDICT: "predict",
    "/tensorflow.serving.PredictionService/Classify": "classify",
    "/tensorflow.serving.PredictionService/Regress": "regress",
}
MAX_MESSAGE = 2**31 - 1  # as TF Serving's own limit (INT32_MAX)
MESSAGE_OPTIONS = [("grpc.max_send_message_length", MAX_MESSAGE), ("grpc.max_receive_message_length", MAX_MESSAGE)]
# Metadata gRPC itself sets on each hop: not the client's to forward.
_OWN_KEYS = frozenset({"user-agent", "content-type", "te", "grpc-accept-encoding", "grpc-timeout", "grpc-encoding"})


def forwarded_metadata(metadata) -> tuple:
    return tuple((k, v) for k, v in metadata or () if not k.startswith(":") and k not in _OWN_KEYS)


class Forwarder(grpc.GenericRpcHandler):
    """Every forwarded method, as a raw-bytes handler over one upstream channel. `in_flight` counts the calls being
    answered; `cut`, those still in flight when the server's stop grace ran out. Predict, Classify and Regress are
    routed (`router`) and counted by version (`metrics`); `shadow` (set once the loop runs) mirrors Predict."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        capture: ProxyCapture | None,
        upstream: UpstreamLog,
        wait_s: float,
        router: Router | None = None,
        metrics: ProxyMetrics | None = None,
    ):
        self.channel, self.capture, self.upstream, self.wait_s = channel, capture, upstream, wait_s
        self.router, self.metrics, self.shadow = router or Router(None), metrics or ProxyMetrics(), None
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}
        self.stopping, self.cut, self.in_flight = False, 0, 0

    def service(self, handler_call_details):
        method = handler_call_details.method
        handler = self._handlers.get(method)
        if handler is None and method.startswith(FORWARDED) and method not in STREAMING:
            handler = self._handlers[method] = grpc.unary_unary_rpc_method_handler(self._forwarding(method))
        return handler  # None: UNIMPLEMENTED, as TF Serving answers a method it lacks

    def _forwarding(self, method: str):
        upstream = self.channel.unary_unary(method)  # no serializers: bytes in, bytes out
        capture = self.capture if method == PREDICT else None
        api = ROUTED.get(method)

        async def forward(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            metadata = forwarded_metadata(context.invocation_metadata())
            origin = origin_of(metadata)
            sampled = capture is not None and origin is None and capture.sample()
            started = time.perf_counter()
            spec, decision, sent = self._route(request, metadata, origin) if api else (None, PASS, request)
            call = None
            self.in_flight += 1  # on the event loop's one thread: no lock
            try:
                remaining = context.time_remaining()
                await wait_reachable(self.channel, self.wait_s if remaining is None else min(self.wait_s, remaining))
                call = upstream(sent, timeout=context.time_remaining(), metadata=metadata)
                response = await call
            except grpc.aio.AioRpcError as err:
                self._failed(err)
                if spec is not None:
                    self._count(spec, decision, api, err.code().name, None, started)
                await context.abort(err.code(), err.details() or "", err.trailing_metadata() or ())
            except asyncio.CancelledError:  # the client left, or the stop grace ran out: so does the upstream call
                if call is not None:
                    call.cancel()
                self.cut += self.stopping
                if spec is not None:
                    self._count(spec, decision, api, "CANCELLED", None, started)
                raise
            finally:
                self.in_flight -= 1
            self.upstream.answered(GRPC)
            if spec is not None:
                self._count(spec, decision, api, "OK", response, started)
                if self.shadow is not None and api == "predict":
                    self._tell_shadow(spec.name, decision, request, response, metadata, started)
            trailing = await call.trailing_metadata()
            if trailing:
                context.set_trailing_metadata(tuple(trailing))
            if capture is not None and origin is not None:
                capture.own_call()
            elif sampled:
                capture.log(request, response, metadata)
            return response

        return forward

    def _route(self, request: bytes, metadata: tuple, origin: str | None):
        """(the request's model_spec as sent, where it goes, the bytes to send); a request that does not parse
        passes, and so does trainserve's own (`origin` set: an eval or replay of `stable` measures stable)."""
        try:
            spec = request_spec(request)
        except (WireError, ValueError):
            return None, PASS, request
        if origin is not None:
            return spec, PASS, request
        headers = {key.lower(): value for key, value in metadata}
        label = None if spec.HasField("version") else spec.version_label
        decision = self.router.decide(spec.name, label, lambda name: headers.get(name.lower()))
        if decision.route == CANARY:
            return spec, decision, with_version(request, spec, decision.version)
        if decision.as_stable:
            sent = with_label(request, spec, STABLE_LABEL)
            return request_spec(sent), decision, sent
        return spec, decision, request

    def _count(self, spec, decision: Decision, api: str, status: str, response: bytes | None, started: float) -> None:
        """Count one finished call by the version that answered (see trainserve.proxy.proxy_metrics)."""
        answered = answered_version(response) if response is not None else None
        label = spec.version_label
        if answered is not None:
            version = str(answered)
            if not spec.HasField("version") and decision.route != CANARY:
                self.metrics.label_versions[(spec.name, label)] = version
        elif decision.route == CANARY:
            version = str(decision.version)
        elif spec.HasField("version"):
            version = str(spec.version.value)
        else:
            version = self.metrics.label_versions.get((spec.name, label), "")
        micros = (time.perf_counter() - started) * 1e6
        self.metrics.request(spec.name, version, api, status, decision.route, micros)

    def _tell_shadow(
        self, model: str, decision: Decision, request: bytes, response: bytes, metadata: tuple, started: float
    ) -> None:
        """An answered predict call: a shadowed one offers its copy, with its latency (the shadow sheds while the
        clients' latency rises); one of a model no route shadows is quiet for every replica, the shadow's baseline."""
        latency = time.perf_counter() - started
        if decision.shadow is not None:
            self.shadow.offer(model, decision.shadow, request, response, metadata, latency)
            return
        route = self.router.routing.route(model)
        if decision.route != CANARY and not (route and route.shadow_percent):
            self.shadow.unshadowed(model, len(request), latency)

    def _failed(self, err: grpc.aio.AioRpcError) -> None:
        """UNAVAILABLE: the call did not reach TF Serving (refused, reset, TLS refused); any other code is an answer."""
        if err.code() is grpc.StatusCode.UNAVAILABLE:
            self.upstream.failed(GRPC, f"{err.code().name}: {err.details()}")
        else:
            self.upstream.answered(GRPC)


async def start_grpc_proxy(
    port: int, forwarder: Forwarder, credentials: grpc.ServerCredentials | None
) -> tuple[grpc.aio.Server, int]:
    """The proxy's gRPC server on 0.0.0.0:`port`, started; returns it and the bound port."""
    server = grpc.aio.server(options=MESSAGE_OPTIONS)
    server.add_generic_rpc_handlers((forwarder,))
    address = f"0.0.0.0:{port}"
    bound = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"port {port} could not be bound")
    await server.start()
    return server, bound


def upstream_channel(target: str, tls, wait_s: float) -> grpc.aio.Channel:
    """The aio channel to TF Serving, plaintext or TLS (`--tls-*`, checked as every client checks them), trying
    to reconnect at most `wait_s` apart."""
    options = MESSAGE_OPTIONS + tls.channel_options() + reconnect_options(wait_s)
    if not tls.enabled:
        return grpc.aio.insecure_channel(target, options=options)
    return grpc.aio.secure_channel(target, tls.credentials(), options=options)
