"""Routing in the proxy, in front of a real serve-local serving two versions of one model (stable = 1,
candidate 2): the canary share answered by the candidate (seeded draws, recounted here), sticky callers who never
switch, shadow pairs and flips equal to a count made here from direct calls, per-version counts on the metrics
page, routing-file edits followed on the next poll and bad ones refused in one line with the routing kept."""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
from routing_fixtures import SEED, answered_by, page, proxy_starter, requests, rest_predict, route, serve_three_versions

from conftest import DIRECT
from serving_fixtures import IMAGES, predict_request, stubs
from trainserve.proxy.config import ProxyConfig
from trainserve.proxy.routing import SCHEMA, default_sticky_salt, write_routing
from trainserve.tensors import from_tensor_proto


@pytest.fixture(scope="module")
def two_versions(model_versions, tmp_path_factory):
    server = serve_three_versions(model_versions, tmp_path_factory.mktemp("routing"))
    yield server
    assert server.stop() == 0


@pytest.fixture
def proxy_for(two_versions, tmp_path):
    proxies = []
    yield proxy_starter(two_versions, tmp_path, proxies)
    for proxy in proxies:
        proxy.stop(5)


@pytest.mark.integration
def test_a_canary_share_is_the_seeded_draws_and_within_the_binomial_bound(proxy_for):
    n, percent = 300, 20
    proxy = proxy_for(route(canary=percent))
    versions = answered_by(proxy, n)
    draws = random.Random(SEED)
    expected = [2 if draws.random() * 100 < percent else 1 for _ in range(n)]  # one draw per stable request
    assert versions == expected
    k = versions.count(2)
    assert abs(k - n * percent / 100) <= 4 * (n * 0.2 * 0.8) ** 0.5, k
    counts = page(proxy)
    assert requests(counts, version="2", route="canary", status="OK") == k
    assert requests(counts, version="1", route="stable", status="OK") == n - k


@pytest.mark.unit
def test_requests_naming_a_version_or_another_label_pass_untouched(proxy_for, two_versions):
    proxy = proxy_for(route(canary=100))
    assert set(answered_by(proxy, 5)) == {2}
    assert set(answered_by(proxy, 5, label=None, version=1)) == {1}
    predict, _ = stubs(type("T", (), {"target": f"127.0.0.1:{proxy.port}"}))
    with pytest.raises(grpc.RpcError) as err:  # a label the server lacks: its own answer, not rewritten
        predict.Predict(predict_request(label="canary"), timeout=30)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT or err.value.code() is grpc.StatusCode.NOT_FOUND
    counts = page(proxy)
    assert requests(counts, route="direct", version="1", status="OK") == 5
    assert requests(counts, route="direct", status=err.value.code().name) == 1


@pytest.mark.unit
def test_trainserves_own_calls_are_not_routed(proxy_for):
    from trainserve.traffic.origin import EVAL, origin_metadata

    proxy = proxy_for(route(canary=100, shadow=100))
    assert set(answered_by(proxy, 3, metadata=origin_metadata(EVAL))) == {1}  # an eval of `stable` measures stable
    assert not proxy.metrics.shadow
    body = json.dumps({"instances": IMAGES[:1].tolist()}).encode()
    headers = {"Content-Type": "application/json", **dict(origin_metadata(EVAL))}
    request = urllib.request.Request(
        f"http://127.0.0.1:{proxy.rest_port}/v1/models/m/labels/stable:predict", body, headers
    )
    with DIRECT.open(request, timeout=30) as answer:
        assert answer.status == 200
    assert requests(page(proxy), route="direct", version="1") == 4


@pytest.mark.unit
def test_a_canary_answer_is_the_candidates_answer(proxy_for, two_versions):
    proxy = proxy_for(route(canary=100))
    predict, _ = stubs(type("T", (), {"target": f"127.0.0.1:{proxy.port}"}))
    direct, _ = stubs(two_versions)
    through = predict.Predict(predict_request(label="stable"), timeout=30)
    candidate = direct.Predict(predict_request(version=2), timeout=30)
    assert through == candidate


def independent_point(salt: str, value: str) -> float:
    return int(hashlib.sha256(f"{salt}\0{value}".encode()).hexdigest()[:16], 16) / 2**64


@pytest.mark.unit
def test_sticky_callers_never_switch_and_stay_in_as_the_share_grows(proxy_for):
    proxy = proxy_for(route(canary=30, sticky="X-User-Id"))  # header names compare case-insensitively
    callers = [f"user-{i}" for i in range(30)]
    salt = "m:2"  # no sticky_salt in the file: the model's and candidate's
    assert default_sticky_salt("m", 2) == salt
    seen = {c: set(answered_by(proxy, 3, metadata=(("x-user-id", c),))) for c in callers}
    assert all(len(v) == 1 for v in seen.values()), seen
    assert {c for c, v in seen.items() if v == {2}} == {c for c in callers if independent_point(salt, c) * 100 < 30}
    write_routing(proxy.config.routing_file, route(canary=70, sticky="x-user-id"))
    assert proxy.router.poll()
    later = {c: set(answered_by(proxy, 2, metadata=(("x-user-id", c),))) for c in callers}
    assert all(later[c] == {2} for c, v in seen.items() if v == {2}), "a canary caller went back to stable"
    assert {c for c, v in later.items() if v == {2}} == {c for c in callers if independent_point(salt, c) * 100 < 70}
    write_routing(proxy.config.routing_file, route(canary=30, sticky="x-user-id", salt="rollout-9"))
    assert proxy.router.poll()
    salted = {c for c in callers if answered_by(proxy, 1, metadata=(("x-user-id", c),)) == [2]}
    assert salted == {c for c in callers if independent_point("rollout-9", c) * 100 < 30}


@pytest.mark.unit
def test_shadow_pairs_and_flips_equal_a_count_from_direct_calls(proxy_for, two_versions):
    rng = np.random.default_rng(3)
    batches = [rng.integers(0, 256, (8, 8, 8, 1), dtype=np.uint8) for _ in range(6)]
    proxy = proxy_for(route(shadow=100))
    predict, _ = stubs(type("T", (), {"target": f"127.0.0.1:{proxy.port}"}))
    direct, _ = stubs(two_versions)
    flips = 0
    for images in batches:
        answer = predict.Predict(predict_request(label="stable", images=images), timeout=30)
        assert answer.model_spec.version.value == 1  # the client always gets stable's answer
        top = [
            from_tensor_proto(direct.Predict(predict_request(version=v, images=images), timeout=30).outputs[k])
            for v in (1, 2)
            for k in ["probabilities"]
        ]
        flips += int((top[0].argmax(axis=1) != top[1].argmax(axis=1)).sum())
    assert flips > 0, "versions 1 and 2 must disagree somewhere"
    two_versions.wait_for(
        lambda: (
            page(proxy).get(':trainserve:proxy:shadow_requests{model_name="m",version="2",outcome="compared"}')
            == len(batches)
        ),
        "every shadow copy compared",
    )
    counts = page(proxy)
    assert counts[':trainserve:proxy:shadow_pairs{model_name="m",version="2"}'] == 8 * len(batches)
    assert counts[':trainserve:proxy:shadow_flips{model_name="m",version="2"}'] == flips
    assert counts[':trainserve:proxy:shadow_latency_count{model_name="m",version="2"}'] == len(batches)
    assert requests(counts, version="2") == 0, "a shadow call is not a client's request"

    write_routing(proxy.config.routing_file, route(candidate=3, shadow=100))  # 1's weights: the same answers
    assert proxy.router.poll()
    for images in batches:
        predict.Predict(predict_request(label="stable", images=images), timeout=30)
    compared = ':trainserve:proxy:shadow_requests{model_name="m",version="3",outcome="compared"}'
    two_versions.wait_for(lambda: page(proxy).get(compared) == len(batches), "every copy to 3 compared")
    counts = page(proxy)
    assert counts[':trainserve:proxy:shadow_pairs{model_name="m",version="3"}'] == 8 * len(batches)
    assert counts[':trainserve:proxy:shadow_flips{model_name="m",version="3"}'] == 0


@pytest.mark.unit
def test_routing_edits_apply_on_the_next_poll_and_a_bad_edit_is_refused_in_one_line(proxy_for, caplog):
    proxy = proxy_for(route(canary=0))
    assert set(answered_by(proxy, 3)) == {1}
    path = proxy.config.routing_file
    write_routing(path, route(canary=100))
    assert set(answered_by(proxy, 2)) == {1}, "applied before the poll"
    assert proxy.router.poll()
    assert set(answered_by(proxy, 3)) == {2}
    for bad in (
        json.dumps({"schema": SCHEMA, "models": {"m": {"candidate": 2, "canary_percent": 120}}}),
        json.dumps({"schema": SCHEMA, "models": {"m": {"candidate": 2, "canary_percent": 5}}})[:-3],
        json.dumps({"schema": SCHEMA, "models": {"m": {"candidate": "two"}}}),
    ):
        path.write_text(bad)
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="trainserve.proxy.router"):
            assert not proxy.router.poll()
            assert not proxy.router.poll()  # the same bad content: not logged again
        assert len(caplog.records) == 1 and "\n" not in caplog.records[0].getMessage(), caplog.text
        assert "expected" in caplog.records[0].getMessage()
        assert set(answered_by(proxy, 2)) == {2}, "the running routing was not kept"
        assert page(proxy)[":trainserve:proxy:routing_refused"] == 1
    path.unlink()
    path.mkdir()  # unreadable: refused once, not at every poll
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="trainserve.proxy.router"):
        assert not proxy.router.poll() and not proxy.router.poll()
    assert len(caplog.records) == 1 and "cannot read it" in caplog.text, caplog.text
    assert set(answered_by(proxy, 2)) == {2}
    path.rmdir()
    assert proxy.router.poll()
    assert set(answered_by(proxy, 2)) == {1}
    counts = page(proxy)
    assert counts[":trainserve:proxy:routing_refused"] == 0
    assert counts[':trainserve:proxy:routing_reloads{outcome="refused"}'] == 4


@pytest.mark.unit
def test_the_watch_thread_follows_the_file(proxy_for, two_versions):
    proxy = proxy_for(route(canary=0))
    proxy.router.watch(0.05)
    write_routing(proxy.config.routing_file, route(canary=100, shadow=0))
    two_versions.wait_for(lambda: proxy.router.routing.route("m").canary_percent == 100, "the watcher's poll")
    assert set(answered_by(proxy, 2)) == {2}


@pytest.mark.unit
def test_a_canary_to_a_version_not_served_fails_and_is_counted_against_it(proxy_for):
    proxy = proxy_for(route(candidate=9, canary=100))
    predict, _ = stubs(type("T", (), {"target": f"127.0.0.1:{proxy.port}"}))
    with pytest.raises(grpc.RpcError) as err:
        predict.Predict(predict_request(label="stable"), timeout=30)
    counts = page(proxy)
    assert requests(counts, version="9", route="canary", status=err.value.code().name) == 1
    assert requests(counts, version="1") == 0


@pytest.mark.unit
def test_latency_histogram_has_serve_locals_buckets_and_counts_each_call(proxy_for):
    proxy = proxy_for(route(canary=0))
    answered_by(proxy, 4)
    counts = page(proxy)
    key = ':trainserve:proxy:request_latency_bucket{model_name="m",version="1",api="predict",le="+Inf"}'
    assert counts[key] == 4
    bounds = [m.group(1) for k in counts if (m := re.search(r'version="1",api="predict",le="([^"]+)"', k))]
    assert bounds[:3] == ["10", "18", "32.4"] and len(bounds) == 34


@pytest.mark.unit
def test_rest_requests_are_routed_and_counted_as_grpc_ones_are(proxy_for, two_versions):
    proxy = proxy_for(route(canary=100, sticky="x-user-id"))
    via = f"http://127.0.0.1:{proxy.rest_port}"
    candidate = rest_predict(two_versions.rest, "/v1/models/m/versions/2:predict")
    stable = rest_predict(two_versions.rest, "/v1/models/m/versions/1:predict")
    assert candidate != stable
    assert rest_predict(via, "/v1/models/m/labels/stable:predict", {"x-user-id": "u"}) == candidate
    assert rest_predict(via, "/v1/models/m/versions/1:predict") == stable  # a version named: untouched
    assert rest_predict(via, "/v1/models/m/versions/3:predict") == stable  # 3 has 1's weights
    assert rest_predict(via, "/v1/models/m/labels/nope:predict")[0] in (400, 404)
    counts = page(proxy)
    assert requests(counts, route="canary", version="2", api="predict", status="OK") == 1
    assert requests(counts, route="direct", version="1", api="predict", status="OK") == 1
    assert requests(counts, route="direct", version="3", api="predict", status="OK") == 1
    assert (
        requests(counts, route="direct", api="predict", status="INVALID_ARGUMENT")
        + requests(counts, route="direct", api="predict", status="NOT_FOUND")
        == 1
    )


@pytest.mark.unit
def test_a_bad_shadow_flag_is_one_line():
    from trainserve.errors import TrainserveError

    with pytest.raises(TrainserveError, match="--shadow-workers 0 / "):
        ProxyConfig(filename_prefix="caps/p", shadow_workers=0).check()


@pytest.mark.unit
def test_names_from_clients_cannot_grow_the_page(proxy_for):
    proxy = proxy_for(route(canary=0))
    predict, _ = stubs(type("T", (), {"target": f"127.0.0.1:{proxy.port}"}))
    answered_by(proxy, 1)
    for request in [predict_request(model=f"nope-{i}") for i in range(5)] + [
        predict_request(version=99 + i) for i in range(3)
    ]:
        with pytest.raises(grpc.RpcError):
            predict.Predict(request, timeout=30)
    counts = page(proxy)
    assert requests(counts, model_name="<unknown>", version="") == 5  # models that never answered: one series
    assert requests(counts, model_name="m", version="") == 3  # versions that never answered: no series of their own
    series = [k for k in counts if k.startswith(":trainserve:proxy:request_count{")]
    assert len(series) == 3, series
