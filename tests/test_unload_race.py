"""Versions loading and unloading while 16 clients call serve-local over real gRPC.

The manager is driven from the test (model config policy changes, then a poll: what the poller does), and every
cycle holds one request at the moment the old race opened, resolved but not yet run, until the version it
resolved has unloaded. As TF Serving's ServableHandle, that request must finish on the version it resolved;
a request that arrives after the unload gets TF Serving's NOT_FOUND (core/basic_manager.cc); no answer is ever
UNKNOWN, another error, or another version's numbers.
"""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc
import numpy as np
import pytest

from conftest import install_version
from serving_fixtures import expected, predict_request, rpc_error, stubs
from trainserve.model_server_config import single_model_config
from trainserve.serving.config import Batching
from trainserve.serving.grpc_api import GrpcServer
from trainserve.serving.manager import ModelManager, ServedModel, State
from trainserve.serving.servables import Servables
from trainserve.tensors import from_tensor_proto

CLIENTS = 16
CYCLES = 6
VERSIONS = (1, 2, 3)  # each cycle loads the next (1 -> 2 -> 3 -> 1 ...) and unloads the one before


class Hold:
    """Holds the first request that resolves version `target`, after its resolution and before its run, until
    `release` is set: the moment where an unload used to take the model from under a request."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._target: int | None = None
        self.caught, self.release = threading.Event(), threading.Event()

    def arm(self, version: int) -> None:
        self.caught.clear()
        self.release.clear()
        with self._lock:
            self._target = version

    def after_resolve(self, servable) -> None:
        with self._lock:
            taken = servable.version == self._target
            if taken:
                self._target = None
        if taken:
            self.caught.set()
            assert self.release.wait(120), "the test never released the held request"


@pytest.fixture(name="hold")
def hold_fixture(monkeypatch) -> Hold:
    """Every version resolution passes through a Hold the test arms."""
    hold, resolve = Hold(), ServedModel.resolve

    def resolve_then_hold(self, version=None, label=None):
        servable = resolve(self, version, label)
        hold.after_resolve(servable)
        return servable

    monkeypatch.setattr(ServedModel, "resolve", resolve_then_hold)
    return hold


@dataclass
class Answer:
    """One client call as the client saw it."""

    pinned: int | None  # the version asked for (None: the latest)
    code: str
    version: int | None = None  # the version that answered
    right: bool = True  # its numbers are that version's own
    details: str = ""


@dataclass
class Clients:
    """16 threads calling Predict (latest, or pinned to a version) and GetModelMetadata until stopped."""

    target: str
    expected: dict[int, dict[str, np.ndarray]]
    answers: list[list[Answer]] = field(default_factory=lambda: [[] for _ in range(CLIENTS)])
    stop: threading.Event = field(default_factory=threading.Event)
    progress: threading.Condition = field(default_factory=threading.Condition)

    def start(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self._run, args=(i,), name=f"client-{i}") for i in range(CLIENTS)]
        for thread in threads:
            thread.start()
        return threads

    def _run(self, index: int) -> None:
        predict, _ = stubs(self)
        sequence = 0
        while not self.stop.is_set():
            sequence += 1
            pinned = VERSIONS[(index + sequence) % len(VERSIONS)] if sequence % 3 == 1 else None
            answer = self._call(predict, pinned, metadata=sequence % 3 == 2)
            with self.progress:
                self.answers[index].append(answer)
                self.progress.notify_all()

    def _call(self, predict, pinned: int | None, metadata: bool) -> Answer:
        from tensorflow_serving.apis import get_model_metadata_pb2

        try:
            if metadata:
                request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
                request.model_spec.name = "m"
                response = predict.GetModelMetadata(request, timeout=120)
                return Answer(pinned, "OK", response.model_spec.version.value)
            response = predict.Predict(predict_request(version=pinned), timeout=120)
        except grpc.RpcError as err:
            return Answer(pinned, err.code().name, details=err.details())
        version = response.model_spec.version.value
        want = self.expected.get(version)
        right = want is not None and np.allclose(
            from_tensor_proto(response.outputs["probabilities"]), want["probabilities"], atol=1e-5
        )
        return Answer(pinned, "OK", version, bool(right))

    def answered(self) -> list[int]:
        with self.progress:
            return [len(a) for a in self.answers]

    def wait_each_answered_after(self, counts: list[int]) -> None:
        """Until every client has had one more answer than `counts`: all 16 overlap each cycle."""
        with self.progress:
            done = self.progress.wait_for(lambda: all(len(a) > n for a, n in zip(self.answers, counts)), 120)
        assert done, "a client got no answer within 120 s"


def policy(base, versions: set[int]):
    """The model config serving exactly `versions` of model m (a `specific` version policy)."""
    config = single_model_config("m", str(base))
    config.model_config_list.config[0].model_version_policy.specific.versions.extend(sorted(versions))
    return config


@pytest.fixture(name="versions_on_disk")
def versions_on_disk_fixture(model_versions, tmp_path):
    """m/1, m/2, m/3: three versions whose answers differ, with each one's answers computed in process."""
    base = tmp_path / "m"
    answers = {}
    for version, template in zip(VERSIONS, model_versions):
        install_version(template, base, version)
        answers[version] = expected(template)
    for a, b in itertools.combinations(VERSIONS, 2):
        assert not np.allclose(answers[a]["probabilities"], answers[b]["probabilities"], atol=1e-3), (a, b)
    return base, answers


@pytest.mark.integration
@pytest.mark.parametrize(
    "batching", [None, Batching(max_batch_size=64, max_enqueued_batches=1000)], ids=["alone", "batched"]
)
def test_requests_racing_unloads_finish_on_their_version_or_get_not_found(versions_on_disk, batching, hold):
    base, answers = versions_on_disk
    manager = ModelManager()
    manager.configure(policy(base, {1}))
    manager.poll()
    servables = Servables(manager, batching)
    server = GrpcServer(servables, 0, run_threads=8)
    clients = Clients(f"127.0.0.1:{server.port}", answers)
    threads = clients.start()
    try:
        drive_cycles(manager, base, hold, clients)
    finally:
        clients.stop.set()
        hold.release.set()
        for thread in threads:
            thread.join(120)
        server.stop(0).result(60)
        servables.drain()
        server.close()
        manager.close()

    calls = [a for per_client in clients.answers for a in per_client]
    codes = {code: sum(a.code == code for a in calls) for code in {a.code for a in calls}}
    print(f"{len(calls)} calls over {CYCLES} unloads: {codes}")
    assert all(len(per_client) > CYCLES for per_client in clients.answers), "every client called throughout"
    assert [a for a in calls if not a.right] == [], "an answer with another version's numbers"
    refused = [a for a in calls if a.code != "OK"]
    assert [a for a in refused if a.code != "NOT_FOUND" or a.pinned is None] == [], f"0 UNKNOWN: {codes}"
    assert all(a.details == f"Servable not found for request: Specific(m, {a.pinned})" for a in refused)
    assert {a.version for a in calls if a.code == "OK"} == set(VERSIONS)


def drive_cycles(manager: ModelManager, base, hold: Hold, clients: Clients) -> None:
    """Each cycle: hold a request on the serving version, load the next and unload the held one (as a model
    config reload and a poll do), release the request; a call pinned to the unloaded version is then NOT_FOUND."""
    predict, _ = stubs(clients)
    current = VERSIONS[0]
    for _ in range(CYCLES):
        following = VERSIONS[current % len(VERSIONS)]
        hold.arm(current)
        assert hold.caught.wait(120), f"no request resolved version {current}"
        manager.configure(policy(base, {current, following}))
        manager.poll()  # loads `following`; `current` keeps serving
        manager.configure(policy(base, {following}))
        manager.poll()  # unloads `current`, the held request's version
        assert manager.models["m"].versions[current].state == State.END
        counts = clients.answered()
        hold.release.set()
        err = rpc_error(predict.Predict, predict_request(version=current))
        assert (err.code(), err.details()) == (
            grpc.StatusCode.NOT_FOUND,
            f"Servable not found for request: Specific(m, {current})",
        )
        clients.wait_each_answered_after(counts)
        current = following


@pytest.mark.unit
def test_a_rest_request_held_across_the_unload_of_its_version_finishes_on_it(versions_on_disk, hold):
    """REST resolves first (to read the signature's dtypes) and predicts after: the version it resolved must
    still answer, although it unloaded in between."""
    from serving_fixtures import IMAGES
    from trainserve.serving.rest_api import start_rest_server

    base, answers = versions_on_disk
    manager = ModelManager()
    manager.configure(policy(base, {1}))
    manager.poll()
    servables = Servables(manager, None)
    rest = start_rest_server(servables, 0, None)
    url = f"http://127.0.0.1:{rest.server_address[1]}/v1/models/m:predict"
    hold.arm(1)
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(post_json, url, {"instances": IMAGES.tolist()})
        assert hold.caught.wait(120), "the request never resolved version 1"
        manager.configure(policy(base, {2}))
        manager.poll()  # loads 2, unloads 1: the held request's version
        assert manager.models["m"].versions[1].state == State.END
        hold.release.set()
        status, body = answer.result(120)
    rest.shutdown()
    rest.server_close()
    manager.close()
    assert status == 200, body
    probabilities = np.array([row["probabilities"] for row in body["predictions"]])
    np.testing.assert_allclose(probabilities, answers[1]["probabilities"], atol=1e-5)


def post_json(url: str, body) -> tuple[int, dict]:
    import json
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())
