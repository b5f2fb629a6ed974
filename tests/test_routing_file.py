"""The routing file as a file: writers of one path never share a temp file, two controllers of two models never
undo each other's update (the lock beside it), versions bounded to what model_spec can hold (int64), sticky
callers hashed with a salt per model and candidate, keys added since the schema began optional, and the label
versions the REST side asks of TF Serving cached per (model, label)."""

from __future__ import annotations

import json
import os
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainserve.errors import TrainserveError
from trainserve.files import locked, write_file_atomic
from trainserve.protos import predict_pb2
from trainserve.proxy.labels import LabelVersions
from trainserve.proxy.routing import (
    SCHEMA,
    ModelRoute,
    Routing,
    RoutingError,
    default_sticky_salt,
    parse_routing,
    read_routing,
    sticky_point,
    update_routing,
    write_routing,
)
from trainserve.proxy.wire import MAX_VERSION, WireError, request_spec, with_version

pytestmark = pytest.mark.unit


def test_two_writers_of_one_path_each_write_their_own_temp_file(tmp_path, monkeypatch):
    """Both writers have written their temp file before either renames (a barrier in fsync): with one temp name
    per pid (the same in two containers, and for two threads) the second truncates the first's and its rename
    finds nothing."""
    path, barrier, real_fsync = tmp_path / "routing.json", threading.Barrier(2, timeout=30), os.fsync
    first_fsync = threading.local()

    def fsync_after_both_wrote(fd):
        if not getattr(first_fsync, "done", False):  # the temp file's fsync, not the directory's after the rename
            first_fsync.done = True
            barrier.wait()
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync_after_both_wrote)
    contents, errors = [b"a" * 100_000, b"b" * 10], []

    def write(data: bytes) -> None:
        try:
            write_file_atomic(path, data)
        except BaseException as exc:  # recorded: the test asserts there were none
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(data,)) for data in contents]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert path.read_bytes() in contents, "a mix of the two writers"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["routing.json"], "a temp file left behind"


def test_a_written_file_has_the_mode_open_gives(tmp_path):
    old = os.umask(0o022)
    try:
        mode = os.stat(write_file_atomic(tmp_path / "f", b"x")).st_mode & 0o777
    finally:
        os.umask(old)
    assert mode == 0o644, oct(mode)  # readable by a proxy running as another user, as before


def test_two_controllers_of_two_models_lose_no_update(tmp_path):
    """Two threads each set their model's canary share 0..N-1, read-modify-write under the lock: every routing a
    thread gets back holds the other model's share never going back, and the file ends with both last shares."""
    path, n = tmp_path / "routing.json", 60
    seen: dict[str, list[float]] = {"a": [], "b": []}

    def controller(model: str, other: str) -> None:
        for i in range(n):
            routing = update_routing(path, model, lambda _, i=i: ModelRoute(7, canary_percent=float(i)))
            assert routing.route(model).canary_percent == i
            seen[model].append(routing.route(other).canary_percent if routing.route(other) else -1.0)

    threads = [threading.Thread(target=controller, args=pair) for pair in (("a", "b"), ("b", "a"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    final = read_routing(path)
    assert final.route("a").canary_percent == final.route("b").canary_percent == n - 1
    for model, others in seen.items():
        assert others == sorted(others), f"{model} saw the other model's update undone: {others}"


def test_an_update_waits_for_the_lock_and_keeps_what_its_holder_wrote(tmp_path):
    path = tmp_path / "routing.json"
    write_routing(path, Routing({"old": ModelRoute(1)}))
    holding, done = threading.Event(), threading.Event()
    result = {}

    def update_n() -> None:
        holding.wait(30)
        result["routing"] = update_routing(path, "n", lambda _: ModelRoute(5, canary_percent=5))
        done.set()

    thread = threading.Thread(target=update_n)
    thread.start()
    with locked(path):  # what a second controller holds for its own read-modify-write of model m
        routing = read_routing(path)
        holding.set()
        assert not done.wait(0.2), "the update went ahead while the lock was held"
        write_routing(path, Routing({**routing.models, "m": ModelRoute(2)}))
    thread.join(30)
    assert sorted(read_routing(path).models) == ["m", "n", "old"] == sorted(result["routing"].models)
    refused = pytest.raises(TrainserveError, match="another rollout holds .*routing.json.lock: expected one at a time")
    with refused, locked(path), locked(path, holder="another rollout"):
        pass


def test_an_update_of_a_broken_file_raises_unless_told_to_replace_it(tmp_path):
    path = tmp_path / "routing.json"
    path.write_text('{"schema": "trainserve.routing/1", "models": {"m": {"candidate": -1}}}')
    with pytest.raises(RoutingError, match="candidate -1: expected a version number"):
        update_routing(path, "n", lambda _: None)
    assert update_routing(path, "m", lambda _: None, replace_broken=True) == Routing()
    assert read_routing(path) == Routing()
    inode = os.stat(path).st_ino
    update_routing(path, "m", lambda _: None)  # nothing to change: nothing written
    assert os.stat(path).st_ino == inode


@given(st.integers(min_value=-(2**70), max_value=2**70))
def test_a_candidate_is_accepted_exactly_when_model_spec_can_hold_it(candidate):
    text = json.dumps({"schema": SCHEMA, "models": {"m": {"candidate": candidate, "shadow_percent": 100}}})
    request = predict_pb2.PredictRequest()
    request.model_spec.name, request.model_spec.version_label = "m", "stable"
    wire = request.SerializeToString()
    if 0 <= candidate <= MAX_VERSION:
        assert parse_routing(text).route("m").candidate == candidate
        assert request_spec(with_version(wire, request_spec(wire), candidate)).version.value == candidate
    else:
        with pytest.raises(RoutingError, match=r"expected a version number \(an integer from 0 to 2\*\*63-1\)"):
            parse_routing(text)
        with pytest.raises(WireError, match="expected an integer from 0 to"):
            with_version(wire, request_spec(wire), candidate)


def test_files_without_the_new_keys_still_parse_and_the_new_key_round_trips():
    old = {"schema": SCHEMA, "models": {"m": {"candidate": 2, "canary_percent": 5, "sticky_header": "x-user"}}}
    assert parse_routing(json.dumps(old)).route("m") == ModelRoute(2, 0.0, 5, "x-user")
    assert Routing({"m": ModelRoute(2, 0.0, 5, "x-user")}).to_json() == old | {
        "models": {"m": old["models"]["m"] | {"shadow_percent": 0.0}}
    }
    salted = Routing({"m": ModelRoute(2, 0, 5, "x-user", "rollout-17")})
    assert parse_routing(json.dumps(salted.to_json())) == salted
    for bad in ("", 7):
        with pytest.raises(RoutingError, match="sticky_salt .*: expected a non-empty string"):
            parse_routing(json.dumps({"schema": SCHEMA, "models": {"m": {"candidate": 2, "sticky_salt": bad}}}))


def test_salted_sticky_shares_of_two_models_are_independent():
    """Unsalted, the same 10 % of callers were every model's canary; salted per model and candidate, the overlap
    of two models' canaries is what independent draws give (binomial, 4 sigma), and a new candidate draws anew."""
    callers, share = [f"caller-{i}" for i in range(4000)], 0.10

    def canary(model: str, candidate: int) -> set[str]:
        route = ModelRoute(candidate, canary_percent=share * 100, sticky_header="x-user-id")
        return {c for c in callers if route.canary_share(model, c, draw=1.0)}

    a, b, a_next = canary("a", 3), canary("b", 3), canary("a", 4)
    assert default_sticky_salt("a", 3) == "a:3"
    for group in (a, b, a_next):
        assert abs(len(group) - len(callers) * share) <= 4 * (len(callers) * share * (1 - share)) ** 0.5
    expected, sd = len(callers) * share**2, (len(callers) * share**2 * (1 - share**2)) ** 0.5
    for x, y in ((a, b), (a, a_next)):
        assert abs(len(x & y) - expected) <= 4 * sd, (len(x & y), expected)


@given(st.text(max_size=20), st.binary(max_size=20), st.floats(0, 100), st.floats(0, 100))
def test_a_sticky_caller_in_the_share_stays_in_as_it_grows(salt, value, low, high):
    low, high = sorted((low, high))
    route = ModelRoute(2, canary_percent=low, sticky_header="h", sticky_salt=salt or None)
    grown = ModelRoute(2, canary_percent=high, sticky_header="h", sticky_salt=salt or None)
    assert not route.canary_share("m", value, 0.0) or grown.canary_share("m", value, 0.0)
    assert 0 <= sticky_point(salt, value) < 1


def test_label_versions_ask_once_per_max_age_and_answer_from_the_cache_between():
    asked, now = [], [0.0]
    answers = {("m", "stable"): "1"}

    def ask(model: str, label: str) -> str | None:
        asked.append((model, label))
        return answers.get((model, label))

    labels = LabelVersions(ask, max_age_s=1.0, clock=lambda: now[0])
    assert [labels.version("m", "stable") for _ in range(3)] == ["1"] * 3
    answers[("m", "stable")] = "3"  # the label moved
    now[0] = 0.9
    assert labels.version("m", "stable") == "1"
    now[0] = 1.0
    assert labels.version("m", "stable") == "3"
    assert labels.version("m", "nope") is None
    assert asked == [("m", "stable"), ("m", "stable"), ("m", "nope")]


def test_a_symlinked_routing_file_is_written_through_to_its_target(tmp_path):
    """The rollout's moves on a routing file that is a link (a user's link to a shared file): the link stays a link,
    and its target holds each change, as the proxy following either path reads it."""
    from trainserve.rollout.moves import clear_route, hold_route, set_route

    shared = tmp_path / "shared" / "routing.json"
    shared.parent.mkdir()
    write_routing(shared, Routing({"other": ModelRoute(3)}))
    link = tmp_path / "routing.json"
    link.symlink_to(shared)
    set_route(link, "m", ModelRoute(2, 100, 5))
    assert link.is_symlink() and os.readlink(link) == str(shared)
    assert read_routing(shared).route("m") == ModelRoute(2, 100, 5) and read_routing(shared).route("other")
    hold_route(link, "m")
    assert link.is_symlink() and read_routing(shared).route("m").canary_percent == 0
    clear_route(link, "m")
    assert link.is_symlink() and read_routing(shared).route("m") is None
    assert not [p.name for p in shared.parent.iterdir() if ".tmp-" in p.name]  # no temp file left beside it
