"""Shadow copies shed by the clients' own latency (trainserve.proxy.shadow_headroom): quiet latency sends every
copy; a rise over the baseline of the calls no copy overlapped sheds them, never sent, and they resume once the
clients' latency is back; the baseline follows a server slowed for good; with N proxy replicas in front of one
server the calls made while the route had no shadow are the baseline, which each replica's own quiet calls (slowed
by the others' copies) cannot raise; the proxy feeds each shadowed call's latency, and each unshadowed one's.
Clocks and latencies are injected: nothing here races a clock."""

from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_routing_shadow import PREDICT, Serving, outcomes, response, run_shadow, stable_request, start_proxy, waited

from trainserve.errors import TrainserveError
from trainserve.protos import predict_pb2
from trainserve.proxy.config import ProxyConfig
from trainserve.proxy.routing import ModelRoute, Routing, write_routing
from trainserve.proxy.shadow import Shadow
from trainserve.proxy.shadow_headroom import MIN_QUIET, QUIET_CALLS, Headroom, kind

pytestmark = pytest.mark.unit
MS = 1e-3
ONE = kind("m", 90)  # a batch of 1, say


class Clock:
    """A clock the test moves: `now` seconds."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def quiet_calls(headroom: Headroom, clock: Clock, latency: float, n: int, of_kind=ONE) -> None:
    """`n` client calls of `latency`, each beginning after every copy came back."""
    for _ in range(n):
        clock.now += 1.0
        headroom.client_call(of_kind, latency)


def overlapped_call(headroom: Headroom, clock: Clock, latency: float, of_kind=ONE) -> None:
    """A client call of `latency` that a copy overlapped: the copy came back while it was being answered."""
    headroom.copy_sent()
    clock.now += latency / 2
    headroom.copy_back()
    clock.now += latency / 2
    headroom.client_call(of_kind, latency)


def test_quiet_latency_sheds_nothing_even_when_every_call_is_overlapped():
    clock = Clock()
    headroom = Headroom(margin=0.2, window=8, clock=clock)
    quiet_calls(headroom, clock, 5 * MS, MIN_QUIET)
    for latency in (5.9, 4.0, 5.5, 6.0, 5.0) * 20:  # each within 20 % of the quiet median
        overlapped_call(headroom, clock, latency * MS)
        assert not headroom.inflated()
    assert len(headroom.quiet[ONE].latencies) == MIN_QUIET, "an overlapped call entered the quiet baseline"


def test_a_latency_rise_sheds_once_the_window_median_passes_the_margin_and_resumes_after():
    clock = Clock()
    headroom = Headroom(margin=0.2, window=8, clock=clock)
    quiet_calls(headroom, clock, 5 * MS, MIN_QUIET + 8)  # the window full of calls judged as quiet as the rest
    inflated = []
    for latency in [10] * 8 + [5] * 8:
        overlapped_call(headroom, clock, latency * MS)
        inflated.append(headroom.inflated())
    # the window's median (the mean of its 4th and 5th smallest of 8) passes 6 ms at the 4th slow call, and falls
    # back to 5 ms at the 5th fast one
    assert inflated == [False] * 3 + [True] * 5 + [True] * 4 + [False] * 4
    assert headroom.quiet[ONE].median() == pytest.approx(5 * MS)


def test_each_size_is_judged_against_its_own_quiet_latency():
    clock, big = Clock(), kind("m", 256 * 800)
    headroom = Headroom(margin=0.2, window=8, clock=clock)
    quiet_calls(headroom, clock, 5 * MS, MIN_QUIET)
    quiet_calls(headroom, clock, 50 * MS, MIN_QUIET, big)
    for _ in range(8):  # as fast as each was quiet: nothing shed, though the batches of 256 take 10x longer
        overlapped_call(headroom, clock, 5 * MS)
        overlapped_call(headroom, clock, 50 * MS, big)
        assert not headroom.inflated()
    for _ in range(5):  # 30 % slower than their own quiet latency: the window's median is theirs
        overlapped_call(headroom, clock, 65 * MS, big)
    assert headroom.inflated()
    assert kind("m", 90) == kind("m", 127) != kind("m", 128) != kind("other", 90)


def test_nothing_is_shed_for_latency_before_the_baseline_has_enough_quiet_calls():
    clock = Clock()
    headroom = Headroom(margin=0.2, window=1, clock=clock)
    quiet_calls(headroom, clock, 5 * MS, MIN_QUIET - 1)
    overlapped_call(headroom, clock, 50 * MS)
    assert headroom.quiet[ONE].median() is None and not headroom.inflated()
    quiet_calls(headroom, clock, 5 * MS, 1)
    overlapped_call(headroom, clock, 50 * MS)
    assert headroom.inflated()


def test_the_baseline_follows_a_server_slowed_for_good():
    clock = Clock()
    headroom = Headroom(margin=0.2, window=8, clock=clock)
    quiet_calls(headroom, clock, 5 * MS, QUIET_CALLS)
    quiet_calls(headroom, clock, 10 * MS, 8)  # slower without any copy: shed while the baseline is the old one
    assert headroom.inflated()
    quiet_calls(headroom, clock, 10 * MS, QUIET_CALLS // 2 + 8)  # the copies shed meanwhile: every call quiet
    assert headroom.quiet[ONE].median() == pytest.approx(10 * MS) and not headroom.inflated()


SKEW = 20.0  # a routing poll plus a copy's deadline, as the shadow sets it from its flags


def unshadowed_calls(headroom: Headroom, clock: Clock, latency: float, n: int, of_kind=ONE) -> None:
    """`n` client calls of `latency`, one a second, while the model's route has no shadow share."""
    for _ in range(n):
        clock.now += 1.0
        headroom.unshadowed_call(of_kind, latency)


def test_two_replicas_slowed_by_each_others_copies_shed_against_the_calls_before_the_shadow():
    # issue 58: each replica's own quiet calls meet the other replica's copies and take 2x, as its shadowed calls
    # do; judged against them, neither sheds while every call takes 2x
    clock = Clock()
    alone = Headroom(margin=0.2, window=8, skew=SKEW, clock=clock)
    replica = Headroom(margin=0.2, window=8, skew=SKEW, clock=clock)
    unshadowed_calls(replica, clock, 5 * MS, MIN_QUIET)
    clock.now += SKEW
    for headroom in (alone, replica):
        quiet_calls(headroom, clock, 10 * MS, QUIET_CALLS)  # none of its own copies out: the other's were
        for _ in range(8):
            overlapped_call(headroom, clock, 10 * MS)
    assert not alone.inflated(), "the rule before replicas sheds here"
    assert replica.baseline(ONE) == pytest.approx(5 * MS) and replica.inflated()


def test_calls_within_the_skew_of_a_shadow_are_not_the_baseline():
    clock = Clock()
    headroom = Headroom(margin=0.2, window=8, skew=SKEW, clock=clock)
    unshadowed_calls(headroom, clock, 5 * MS, 2 * MIN_QUIET)
    unshadowed_calls(headroom, clock, 10 * MS, int(SKEW) - 1)  # another replica shadows already; this one not yet
    assert headroom.baseline(ONE) == pytest.approx(5 * MS)  # those calls are pending
    quiet_calls(headroom, clock, 10 * MS, 1)  # this replica sees the shadow: the pending calls are discarded
    assert list(headroom.unshadowed[ONE].latencies) == [5 * MS] * 2 * MIN_QUIET and not headroom.pending.get(ONE)
    unshadowed_calls(headroom, clock, 10 * MS, int(SKEW) - 1)  # the shadow ended here, other copies may not have
    assert not headroom.pending.get(ONE), "a call that began within the skew of the shadow is pending"
    clock.now += 2 * SKEW
    headroom.unshadowed_call(ONE, 10 * MS)  # began after: it will enter
    assert list(headroom.pending[ONE]) == [(clock.now, 10 * MS)]
    assert list(headroom.unshadowed[ONE].latencies) == [5 * MS] * 2 * MIN_QUIET


def test_while_shadowing_the_baseline_follows_the_server_down_not_up_and_up_once_the_shadow_ends():
    clock = Clock()
    headroom = Headroom(margin=0.2, window=8, skew=SKEW, clock=clock)
    unshadowed_calls(headroom, clock, 5 * MS, MIN_QUIET)
    clock.now += SKEW
    quiet_calls(headroom, clock, 10 * MS, QUIET_CALLS)
    assert headroom.baseline(ONE) == pytest.approx(5 * MS)
    quiet_calls(headroom, clock, 3 * MS, QUIET_CALLS)
    assert headroom.baseline(ONE) == pytest.approx(3 * MS)
    clock.now += SKEW  # the shadow ended; the server is slower for good
    unshadowed_calls(headroom, clock, 10 * MS, QUIET_CALLS + int(SKEW))
    headroom.quiet.clear()  # this replica's quiet calls of the shadow, older than the calls since
    assert headroom.baseline(ONE) == pytest.approx(10 * MS)


def test_a_call_that_began_as_a_copy_came_back_is_not_quiet_and_one_that_began_after_is():
    clock = Clock()
    headroom = Headroom(margin=0.2, window=8, clock=clock)
    headroom.copy_sent()
    clock.now = 1.0
    headroom.copy_back()
    clock.now = 1.004
    headroom.client_call(ONE, 5 * MS)  # began at 0.999: the copy was still out
    headroom.client_call(ONE, 3 * MS)  # began at 1.001
    assert list(headroom.quiet[ONE].latencies) == [3 * MS]
    headroom.copy_sent()
    headroom.client_call(ONE, 1 * MS)  # a copy out now
    assert list(headroom.quiet[ONE].latencies) == [3 * MS]


@settings(max_examples=40, deadline=None)
@given(latencies=st.lists(st.floats(1e-4, 1.0), min_size=MIN_QUIET, max_size=3 * QUIET_CALLS))
def test_the_quiet_latency_is_the_median_of_the_last_quiet_calls(latencies):
    clock = Clock()
    headroom = Headroom(margin=0.2, window=8, clock=clock)
    for latency in latencies:
        quiet_calls(headroom, clock, latency, 1)
    assert headroom.quiet[ONE].median() == pytest.approx(float(np.median(latencies[-QUIET_CALLS:])))


def test_the_shadow_sends_every_copy_at_quiet_latency_and_sheds_them_while_it_rises():
    upstream = Serving(hold_candidate=False)
    clock, sent = Clock(), []

    async def quiet_then_slow(shadow: Shadow) -> None:
        copy = ("m", 2, stable_request().SerializeToString(), response(1).SerializeToString(), ())
        counted = threading.Event()
        for name in ("shadow_outcome", "compared"):  # each copy's outcome sets `counted`
            setattr(shadow.metrics, name, setting(getattr(shadow.metrics, name), counted))
        for latency, gap in [(5 * MS, 1.0)] * (MIN_QUIET + 8) + [(10 * MS, 0.0)] * 8:
            counted.clear()
            clock.now += gap  # 0: the call began before the last copy came back
            shadow.offer(*copy, latency=latency)
            assert await waited(counted), "the copy was never counted"
            sent.append(upstream.calls[2])

    try:
        metrics = run_shadow(upstream, quiet_then_slow, clock=clock, shadow_workers=1)
    finally:
        upstream.stop()
    assert outcomes(metrics) == {"compared": MIN_QUIET + 8 + 3, "shed": 5}
    assert sent[-5:] == [MIN_QUIET + 8 + 3] * 5, "a shed copy was sent"


def setting(count, event: threading.Event):
    """`count` (a ProxyMetrics method) that sets `event` after each call."""

    def wrapped(*args):
        count(*args)
        event.set()

    return wrapped


def test_the_proxy_gives_the_shadow_each_shadowed_calls_kind_and_latency(tmp_path):
    upstream = Serving(hold_candidate=False)
    proxy = start_proxy(upstream, tmp_path)
    seen, walls, headroom = [], [], proxy.shadow.headroom
    headroom.client_call = lambda *call: seen.append(call)  # the loop's thread appends, before the answer leaves
    request = stable_request()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{proxy.port}") as channel:
            call = channel.unary_unary(
                PREDICT, predict_pb2.PredictRequest.SerializeToString, predict_pb2.PredictResponse.FromString
            )
            for _ in range(3):
                began = time.perf_counter()
                call(request, timeout=30)
                walls.append(time.perf_counter() - began)
    finally:
        proxy.stop(5)
        upstream.stop()
    assert [of_kind for of_kind, _ in seen] == [kind("m", request.ByteSize())] * 3
    assert all(0 < latency <= wall for (_, latency), wall in zip(seen, walls))


def test_the_proxy_gives_the_shadow_the_calls_of_a_model_no_route_shadows(tmp_path):
    upstream = Serving(hold_candidate=False)
    proxy = start_proxy(upstream, tmp_path)
    write_routing(tmp_path / "routing.json", Routing({"m": ModelRoute(2, shadow_percent=0)}))
    proxy.router.poll()
    seen, headroom = [], proxy.shadow.headroom
    headroom.unshadowed_call = lambda *call: seen.append(call)
    request = stable_request()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{proxy.port}") as channel:
            call = channel.unary_unary(
                PREDICT, predict_pb2.PredictRequest.SerializeToString, predict_pb2.PredictResponse.FromString
            )
            for _ in range(3):
                call(request, timeout=30)
    finally:
        proxy.stop(5)
        upstream.stop()
    assert [of_kind for of_kind, _ in seen] == [kind("m", request.ByteSize())] * 3
    assert outcomes(proxy.metrics) == {}, "a copy was offered with no shadow share"


@pytest.mark.parametrize(
    "flags", [{"shadow_shed_latency_margin": 0.0}, {"shadow_shed_latency_window": 0}], ids=["margin-0", "window-0"]
)
def test_a_bad_latency_flag_fails_in_one_line(flags):
    with pytest.raises(TrainserveError, match="expected a margin > 0") as caught:
        ProxyConfig(filename_prefix="/c/x", **flags).check()
    assert "\n" not in str(caught.value)
