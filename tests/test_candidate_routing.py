"""A candidate staged by hand (`trainserve candidate --routing-file`, the gated path candidate -> eval -> promote or
-> rollout) never answers a request that names no version: the model is routed with no share before the version
loads (followed by every proxy replica with --prometheus), promote and rollback remove that route only once no
`candidate` is labelled, a route with a share is refused, and the controller takes the no-share route over.
The end-to-end case runs serve-local and the real proxy in process, with version-less callers all along."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
import yaml
from reports import compared_with, eval_report, write
from routing_fixtures import page
from test_rollout_controller_plan import args, closed_port_url

from conftest import REPO, install_version
from serving_fixtures import IMAGES, InProcessServer, predict_request, running_proxy, stubs
from trainserve.cli import build_parser, main
from trainserve.client import ServingClient
from trainserve.errors import TrainserveError
from trainserve.options import config_from_args
from trainserve.proxy.routing import ModelRoute, Routing, read_routing, write_routing
from trainserve.rollout import moves
from trainserve.rollout.config import CandidateConfig, PromoteConfig, RollbackConfig
from trainserve.rollout.config_file import history_path, read_config
from trainserve.rollout.history import append_history
from trainserve.rollout.labels import Rollout
from trainserve.rollout.progress import START, event
from trainserve.rollout.steps import promote, rollback, stage_candidate


class Seen:
    """A server that has applied every change; records what the labels and the model's route were at each ask."""

    def __init__(self, config: Path):
        self.config, self.asks = config, []

    def _saw(self, ask: str) -> None:
        self.asks.append((ask, labels(self.config), route(self.config)))

    def wait_available(self, model, version, wait):
        self._saw(f"available {version}")

    def wait_label(self, model, label, version, wait):
        self._saw(f"{label} {version}")

    def wait_unloaded(self, model, version, wait):
        self._saw(f"unloaded {version}")


def labels(config: Path) -> Rollout:
    return Rollout.of(read_config(config).model_config_list.config[0])


def route(config: Path) -> ModelRoute | None:
    return read_routing(config.parent / "routing.json").route("m")


def publish(base: Path, version: int) -> None:
    (base / str(version)).mkdir(parents=True)
    (base / str(version) / "saved_model.pb").write_bytes(b"graph %d" % version)


@pytest.fixture
def site(tmp_path) -> tuple[Path, Path]:
    """Model m: version 1 stable (no routing file), version 2 published; returns (config, base)."""
    base, config = tmp_path / "models" / "m", tmp_path / "rollout" / "models.config"
    config.parent.mkdir()
    for version in (1, 2):
        publish(base, version)
    stage_candidate(CandidateConfig(config, "m", str(base), 1, "unused:1", 1), Seen(config))
    promote(PromoteConfig(config, write(compared_with(eval_report(base / "1"), None), base.parent / "r1.json")))
    return config, base


def staging(config: Path, *flags: str) -> CandidateConfig:
    """`trainserve candidate`'s config as its command line and TRAINSERVE_* make it."""
    argv = ["candidate", "--config", str(config), "--server", "unused:1", "--wait", "0", *flags]
    return config_from_args(CandidateConfig, build_parser().parse_args(argv))


@pytest.mark.unit
def test_a_candidate_is_loaded_only_once_the_model_is_routed_with_no_share(site, monkeypatch):
    config, _ = site
    monkeypatch.setenv("TRAINSERVE_ROUTING_FILE", str(config.parent / "routing.json"))  # as compose sets it
    server = Seen(config)
    stage_candidate(staging(config), server)
    routed = ModelRoute(2, 0, 0)
    assert server.asks == [
        ("available 2", Rollout(stable=1), routed),  # routed before the version loads: version-less -> stable
        ("candidate 2", Rollout(stable=1, candidate=2), routed),
    ]
    assert route(config) == routed


@pytest.mark.unit
def test_promote_removes_the_route_only_once_the_label_moved(site):
    config, base = site
    routing = config.parent / "routing.json"
    stage_candidate(staging(config, "--routing-file", str(routing)), Seen(config))
    report = write(compared_with(eval_report(base / "2"), 1), base.parent / "r2.json")
    server = Seen(config)
    promote(PromoteConfig(config, report, server="serve-cpu:8500", routing_file=routing), server)
    assert server.asks[-1] == ("stable 2", Rollout(stable=2, previous=1), ModelRoute(2, 0, 0))
    assert route(config) is None


@pytest.mark.unit
@pytest.mark.parametrize("staged", [True, False], ids=["candidate-kept", "no-candidate"])
def test_rollback_removes_the_route_unless_a_candidate_stays_labelled(site, staged):
    config, base = site
    routing = config.parent / "routing.json"
    stage_candidate(CandidateConfig(config, "m", version=2, server="unused:1"), Seen(config))
    promote(PromoteConfig(config, write(compared_with(eval_report(base / "2"), 1), base.parent / "r2.json")))
    publish(base, 3)
    if staged:
        stage_candidate(staging(config, "--routing-file", str(routing)), Seen(config))
    else:
        write_routing(routing, Routing({"m": ModelRoute(3)}))  # left by a candidate that failed to load
    rollback(RollbackConfig(config, "m", routing_file=routing), Seen(config))
    assert labels(config) == Rollout(stable=1, candidate=3 if staged else None)
    assert route(config) == (ModelRoute(3) if staged else None)


@pytest.mark.unit
def test_a_route_with_a_share_is_refused_and_nothing_is_staged(site):
    config, _ = site
    routing = config.parent / "routing.json"
    write_routing(routing, Routing({"m": ModelRoute(1, 0, 5), "n": ModelRoute(4)}))
    before = config.read_bytes(), routing.read_bytes()
    server = Seen(config)
    with pytest.raises(TrainserveError, match=r"gives version 1 of model m a share \(shadow 0 %, canary 5 %\)"):
        stage_candidate(staging(config, "--routing-file", str(routing)), server)
    assert (config.read_bytes(), routing.read_bytes()) == before and server.asks == []


@pytest.mark.unit
def test_a_bad_prometheus_url_is_refused_before_anything_moves(site):
    config, _ = site
    routing, before = config.parent / "routing.json", config.read_bytes()
    flags = ("--routing-file", str(routing), "--prometheus", "prometheus:9090")
    with pytest.raises(TrainserveError, match="expected an http\\(s\\) URL"):
        stage_candidate(staging(config, *flags), Seen(config))
    assert config.read_bytes() == before and not routing.exists()


@pytest.mark.unit
def test_a_first_candidate_with_no_stable_is_not_routed(tmp_path):
    base, config = tmp_path / "models" / "m", tmp_path / "models.config"
    publish(base, 1)
    routing = tmp_path / "routing.json"
    flags = ("--model", "m", "--base-path", str(base), "--routing-file", str(routing))
    stage_candidate(staging(config, *flags), Seen(config))
    assert labels(config) == Rollout(candidate=1) and not routing.exists()  # `stable` would name nothing


@pytest.mark.unit
def test_a_retried_jobs_candidate_step_leaves_the_rollouts_route_alone(site):
    config, _ = site
    routing = config.parent / "routing.json"
    append_history(history_path(config), event(START, "m", 2, plan="shadow 1s, 25% 1s, 100%", stable=1))
    write_routing(routing, Routing({"m": ModelRoute(2, 100, 25)}))
    before = routing.read_bytes()
    stage_candidate(staging(config, "--routing-file", str(routing), "--skip-during-rollout"), Seen(config))
    assert routing.read_bytes() == before


@pytest.mark.unit
def test_the_rollout_takes_over_the_route_a_candidate_left(site, capsys):
    config, base = site
    routing = config.parent / "routing.json"
    stage_candidate(staging(config, "--routing-file", str(routing)), Seen(config))
    report = write(compared_with(eval_report(base / "2"), 1), base.parent / "r2.json")
    argv = args(config, report, "--prometheus", closed_port_url(), "--interval", "0.05", "--max-hold", "0.2")
    assert main(argv) == 75, capsys.readouterr().err  # started, then paused: Prometheus is unreachable
    assert route(config) == ModelRoute(2, 0, 0, None, "m:2")  # the rollout's route now, still with no share


class ScrapesTheProxy:
    """Prometheus as it sees one replica, `proxy`, scraped at every ask: the replica reads its routing file (one
    poll), then its exported canary gauges are read from its own metrics page. `proxy=None`: a replica that never
    reads the file (it reports no route)."""

    def __init__(self, proxy):
        self.proxy, self.clock = proxy, 1000.0

    def value(self, expr: str) -> float | None:
        return self.clock if expr == "vector(time())" else None

    def series(self, expr: str) -> list[tuple[dict, float]]:
        self.clock += 1
        one = {"instance": "proxy"}
        if expr == 'up{job="proxy"}':
            return [(one, 1.0)]
        if expr == 'timestamp(up{job="proxy"})':
            return [(one, self.clock)]
        if not expr.startswith(":trainserve:proxy:canary_percent{") or self.proxy is None:
            return []
        self.proxy.router.poll()
        gauges = [re.search(r'version="(\d+)"', k) for k in page(self.proxy) if "canary_percent{" in k]
        return [(one | {"version": m.group(1)}, 0.0) for m in gauges if m]


@pytest.fixture(scope="module")
def serving(model_versions, tmp_path_factory):
    """serve-local polling a rollout config every second: m version 1 stable, 2 published (other weights)."""
    root = tmp_path_factory.mktemp("candidate-routing")
    base, config = root / "models" / "m", root / "rollout" / "models.config"
    config.parent.mkdir()
    for version in (1, 2):
        install_version(model_versions[version - 1], base, version)
    stage_candidate(CandidateConfig(config, "m", str(base), 1, "unused:1", 1), Seen(config))
    promote(PromoteConfig(config, write(compared_with(eval_report(base / "1"), None), root / "r1.json")))
    flags = ("--model_config_file_poll_wait_seconds=1", "--allow_version_labels_for_unavailable_models")
    server = InProcessServer(f"--model_config_file={config}", *flags)
    server.wait_available("m", 1)
    yield config, server
    assert server.stop() == 0


@pytest.mark.integration
def test_version_less_callers_never_get_a_candidate_staged_by_hand(serving, monkeypatch):
    config, server = serving
    routing = config.parent / "routing.json"
    proxy = running_proxy(server, config.parent / "captures" / "c", routing_file=routing, routing_poll_seconds=3600)
    monkeypatch.setattr(moves, "Prometheus", lambda url: ScrapesTheProxy(proxy))
    predict, _ = stubs(type("T", (), {"target": f"127.0.0.1:{proxy.port}"}))
    request, answered, stop = predict_request(images=IMAGES[:1]), [], threading.Event()

    def call() -> None:  # naming no version, through the proxy, until the candidate is staged
        while not stop.is_set() or not answered:
            answered.append(predict.Predict(request, timeout=30).model_spec.version.value)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    try:
        flags = ("--server", server.target, "--wait", "60", "--routing-file", str(routing))
        staged = staging(config, *flags, "--prometheus", "http://prometheus.invalid:9090")
        stage_candidate(staged, ServingClient(server.target))
    finally:
        stop.set()
        caller.join(timeout=60)
        proxy.stop(5)
    direct, _ = stubs(server)
    assert direct.Predict(request, timeout=30).model_spec.version.value == 2, "TF Serving's answer: the candidate"
    assert set(answered) == {1}, f"{answered.count(2)} of {len(answered)} version-less calls got the candidate"


@pytest.mark.unit
def test_a_replica_that_does_not_follow_the_route_stages_nothing(site, monkeypatch):
    config, _ = site
    routing = config.parent / "routing.json"
    monkeypatch.setattr(moves, "Prometheus", lambda url: ScrapesTheProxy(None))
    before, server = config.read_bytes(), Seen(config)
    flags = ("--routing-file", str(routing), "--prometheus", "http://prometheus.invalid:9090")
    with pytest.raises(TrainserveError, match="not every proxy replica reports the model's route within --wait 0 s"):
        stage_candidate(staging(config, *flags), server)
    assert config.read_bytes() == before and server.asks == []
    assert route(config) == ModelRoute(2), "the route stays: requests naming no version on stable"


def _routing_file(container: dict) -> str | None:
    """The routing file a container's trainserve command is given (its flag, or TRAINSERVE_ROUTING_FILE)."""
    flags = [a.split("=", 1)[1] for a in container.get("args", []) if a.startswith("--routing-file=")]
    env = [e["value"] for e in container.get("env", []) if e["name"] == "TRAINSERVE_ROUTING_FILE"]
    return (flags or env or [None])[0]


@pytest.mark.unit
def test_the_candidate_steps_of_a_deployment_with_prometheus_confirm_the_route_on_it():
    """Where a deployment has the rollout's Prometheus (k8s/overlays/proxy's progressive-delivery component, compose's
    `make rollout`), `candidate` is given it, so that the version loads only once every proxy replica reports the
    model's route, and may reach it."""
    from test_gate_deploy import compose_config
    from test_k8s import all_containers, pod_specs, render

    docs = render("k8s/overlays/proxy")
    containers = {(d["metadata"]["name"], c["name"]): c for d, s in pod_specs(docs) for c in all_containers(s)}
    for job in ("rollout", "promote"):
        (url,) = [e for e in containers[job, "candidate"]["env"] if e["name"] == "TRAINSERVE_PROMETHEUS"]
        assert url["valueFrom"]["configMapKeyRef"]["key"] == "TRAINSERVE_PROMETHEUS", job  # the rollout's own
        egress = [
            rule
            for d in docs
            if d["kind"] == "NetworkPolicy"
            and d["spec"]["podSelector"].get("matchLabels") == {"app.kubernetes.io/name": job}
            for rule in d["spec"].get("egress", [])
        ]
        assert {"protocol": "TCP", "port": 9090} in [p for rule in egress for p in rule["ports"]], job
    services = compose_config()["services"]
    prometheus = services["rollout"]["environment"]["TRAINSERVE_PROMETHEUS"]
    staged = services["rollout-candidate"]
    assert staged["command"] == services["candidate"]["command"]
    assert staged["environment"]["TRAINSERVE_PROMETHEUS"] == prometheus == "http://prometheus:9090"
    assert (
        staged["environment"]["TRAINSERVE_ROUTING_FILE"]
        == services["candidate"]["environment"]["TRAINSERVE_ROUTING_FILE"]
    )
    make = (REPO / "Makefile").read_text()
    rollout_target = make[make.index("\nrollout:") : make.index("\n.PHONY", make.index("\nrollout:"))]
    assert "run --rm rollout-candidate" in rollout_target and "run --rm candidate" not in rollout_target


@pytest.mark.unit
def test_every_label_command_passes_the_file_the_proxy_follows():
    from test_k8s import all_containers, pod_specs, render

    containers = {
        (d["metadata"]["name"], c["name"]): c
        for d, s in pod_specs(render("k8s/overlays/proxy"))
        for c in all_containers(s)
    }
    followed = _routing_file(containers["serve-cpu", "proxy"])
    label_commands = [
        ("rollout", "candidate"),
        ("promote", "candidate"),
        ("promote", "promote"),
        ("rollback", "rollback"),
    ]
    assert followed and {k: _routing_file(containers[k]) for k in label_commands} == dict.fromkeys(
        label_commands, followed
    )
    prometheus = [e for e in containers["rollout", "candidate"]["env"] if e["name"] == "TRAINSERVE_PROMETHEUS"]
    assert prometheus[0]["valueFrom"]["configMapKeyRef"]["key"] == "TRAINSERVE_PROMETHEUS"  # the rollout's own
    compose = yaml.safe_load((REPO / "compose.yaml").read_text())["services"]
    proxy = compose["proxy"]["environment"]["TRAINSERVE_ROUTING_FILE"]
    assert {s: compose[s]["environment"]["TRAINSERVE_ROUTING_FILE"] for s in ("candidate", "promote", "rollback")} == {
        s: proxy for s in ("candidate", "promote", "rollback")
    }
