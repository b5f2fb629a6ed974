"""`trainserve rollout --notify`: the real controller, in process, with a clock that moves only when it sleeps and a
Prometheus played by `Flowing` (one proxy replica whose clients' requests flow while the controller sleeps, split
as the routing file says), tells a receiver listening on a real port of each decision, in the generic format or
Alertmanager's; a receiver that refuses connections changes no decision and costs the rollout no look.
(The approval wait: test_rollout_approval.py.)"""

from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from test_rollout_controller_plan import closed_port_url
from test_rollout_safety import Applied, labels, rollout_events, site, site_in  # noqa: F401 (a fixture)

from trainserve.cli import build_parser
from trainserve.options import config_from_args
from trainserve.proxy.routing import read_routing
from trainserve.rollout.controller import Controller
from trainserve.rollout.ends import RolloutPaused
from trainserve.rollout.labels import Rollout
from trainserve.rollout.measure import THRESHOLD, queries
from trainserve.rollout.notify import fingerprint
from trainserve.rollout.notify_sender import Refused, Sender, parse_receivers
from trainserve.rollout.rollout_config import RolloutConfig

# The unit tests here: in process; the receiver is a thread on a loopback port.

PLAN = "shadow 10s, 5% 10s, 100%"


class Flowing:
    """Prometheus as it sees one proxy replica, `a`: its clients send `rate` requests a second to `stable`, split as
    the routing file says, during each of the controller's sleeps (`flow`). Both versions answer alike (OK, every
    call in the first latency bucket); `flip_share` of the shadow pairs flip. `rate` 0: no traffic."""

    def __init__(self, config: Path, rate: float = 100_000.0, flip_share: float = 0.0):
        self.routing, self.rate, self.flip_share = config.parent / "routing.json", rate, flip_share
        self.totals: dict[str, float] = {}
        self.names = {q: n for le in (None, "1000") for n, q in queries("m", 2, 1, "proxy", le, le).items()}

    def flow(self, seconds: float) -> None:
        now = read_routing(self.routing).route("m")
        shadow, canary = (now.shadow_percent, now.canary_percent) if now else (0.0, 0.0)
        calls = self.rate * seconds
        to_candidate = calls * canary / 100
        copies = (calls - to_candidate) * shadow / 100
        for name, more in {
            "canary_requests": to_candidate,
            "candidate_latency_count": to_candidate,
            "stable_requests": calls - to_candidate,
            "stable_latency_count": calls - to_candidate,
            "shadow_compared": copies,
            "shadow_pairs": copies,
            "shadow_classified": copies,
            "shadow_flips": copies * self.flip_share,
        }.items():
            self.totals[name] = self.totals.get(name, 0.0) + more

    def value(self, expr: str) -> float | None:
        return 1000.0 if expr == "vector(time())" else None

    def series(self, expr: str) -> list[tuple[dict, float]]:
        if expr == 'up{job="proxy"}' or expr.startswith("present_over_time("):
            return [({"instance": "a"}, 1.0)]
        if expr.startswith("timestamp(up"):
            return [({"instance": "a"}, 2000.0)]
        if expr.startswith(":trainserve:proxy:canary_percent{"):
            now = read_routing(self.routing).route("m")
            return [({"instance": "a", "version": "2"}, now.canary_percent)] if now else []
        name = self.names.get(expr)
        if name == THRESHOLD:
            return [({"le": "1000"}, 100.0), ({"le": "+Inf"}, 100.0)]
        return [({"instance": "a"}, float(math.floor(self.totals.get(name, 0.0))))] if name else []


class Time:
    """The controller's clock and sleep: the clock moves only when it sleeps, and traffic flows meanwhile;
    `at_sleep(n)` runs before the n-th sleep returns (n from 1)."""

    def __init__(self, prometheus: Flowing, at_sleep=None):
        self.prometheus, self.at_sleep = prometheus, at_sleep or (lambda n: None)
        self.now, self.sleeps = 0.0, 0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += seconds
        self.prometheus.flow(seconds)
        self.at_sleep(self.sleeps)


def controller(config: Path, report: Path, prometheus: Flowing, time: Time, **more) -> Controller:
    settings = {"interval": 1.0, "wait": 5.0, "max_hold": 30.0, "plan": PLAN, "bake": 0.0, **more}
    rollout = RolloutConfig(config=config, routing_file=config.parent / "routing.json", report=report, **settings)
    rollout.prometheus = "http://prometheus.invalid:9090"
    return Controller(rollout, prometheus, Applied(config), clock=time.clock, sleep=time.sleep)


class Receiver:
    """An HTTP server on a free loopback port that keeps every JSON body POSTed to it."""

    def __init__(self):
        self.bodies: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                outer.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    listening = Receiver()
    yield listening
    listening.stop()


def decisions(config: Path) -> list[tuple]:
    """The rollout's history without the notifications' own record: what was decided, where."""
    return [(e["event"], e.get("step"), e.get("decision")) for e in rollout_events(config) if e["event"] != "notified"]


@pytest.mark.integration
def test_each_decision_of_a_promoted_rollout_is_posted_once_with_the_look_behind_it(site, receiver):  # noqa: F811
    config, report = site
    prometheus = Flowing(config)
    outcome = controller(config, report, prometheus, Time(prometheus), notify=parse_receivers(receiver.url)).run()
    assert outcome.promoted and labels(config) == Rollout(stable=2, previous=1)
    bodies = receiver.bodies  # all delivered: the controller's exit flushed them
    assert [b["event"] for b in bodies] == ["started", "step", "step", "promoted"]
    assert {b["schema"] for b in bodies} == {"trainserve.notification/1"}
    assert all((b["model"], b["candidate"], b["stable"]) == ("m", 2, 1) for b in bodies)
    assert bodies[0]["plan"] == "shadow 100% 10s, 5% 10s, 100%" and bodies[0]["look"] is None
    step = bodies[2]["step"]
    assert (step["number"], step["of"], step["words"], step["canary_percent"]) == (2, 3, "5% 10s", 5.0)
    # the look that advanced the shadow step: its checks, each passed, with what it said
    look = bodies[2]["look"]
    assert (look["step"], look["decision"]) == (0, "advance")
    names = [(c["name"], c["result"]) for c in look["checks"]]
    assert names == [("shadow_errors", "pass"), ("slow_copies", "pass"), ("flip_rate", "pass")]
    assert look["counts"]["shadow_compared"] > 0 and all(c["said"] for c in look["checks"])
    assert bodies[3]["summary"] == "model m version 2 promoted: stable -> 2" and bodies[3]["step"]["words"] == "100%"
    assert bodies[3]["report"] == str(config.parent / "models.config.history-m-v2.html")  # the page written
    assert Path(bodies[3]["report"]).is_file()
    notified = rollout_events(config)[-1]
    assert (notified["event"], notified["delivered"], notified["failed"]) == ("notified", 4, 0)


@pytest.mark.integration
def test_a_receiver_that_refuses_connections_changes_no_decision_and_costs_no_look(site, tmp_path):  # noqa: F811
    config, report = site
    prometheus = Flowing(config)
    time = Time(prometheus)
    outcome = controller(config, report, prometheus, time, notify=parse_receivers(closed_port_url())).run()
    assert outcome.promoted
    notified = rollout_events(config)[-1]
    assert notified["event"] == "notified" and (notified["delivered"], notified["failed"]) == (0, 4)
    assert "refused" in notified["why"], notified["why"]
    # the same rollout told nobody: the same decisions, after as many sleeps, at the same time
    (tmp_path / "quiet").mkdir()
    quiet_config, quiet_report = site_in(tmp_path / "quiet")
    quiet = Flowing(quiet_config)
    quiet_time = Time(quiet)
    assert controller(quiet_config, quiet_report, quiet, quiet_time).run().promoted
    assert decisions(config) == decisions(quiet_config)
    assert (time.sleeps, time.now) == (quiet_time.sleeps, quiet_time.now)


@pytest.mark.unit
def test_a_step_held_past_half_the_hold_is_posted_once_then_its_pause(site, receiver):  # noqa: F811
    config, report = site
    prometheus = Flowing(config, rate=0)
    with pytest.raises(RolloutPaused):
        controller(config, report, prometheus, Time(prometheus), notify=parse_receivers(receiver.url)).run()
    events = [b["event"] for b in receiver.bodies]
    assert events == ["started", "step", "held", "paused"]
    held, paused = receiver.bodies[2], receiver.bodies[3]
    assert held["held_seconds"] >= 15 and held["max_hold_seconds"] == 30 and held["step"]["number"] == 1
    assert "fewer than --gate-min-requests" in held["said"] and held["said"] in held["summary"] and held["time"]
    assert paused["said"] == held["said"] and paused["look"]["decision"] == "hold"


@pytest.mark.unit
def test_a_rollback_is_posted_to_an_alertmanager_receiver_as_alertmanagers_webhook_body(site, receiver):  # noqa: F811
    config, report = site
    prometheus = Flowing(config, flip_share=0.3)
    receivers = parse_receivers(f"alertmanager+{receiver.url}")
    outcome = controller(config, report, prometheus, Time(prometheus), notify=receivers).run()
    assert not outcome.promoted and labels(config) == Rollout(stable=1)
    started, step, rolled_back = receiver.bodies  # one alert: firing while in progress, resolved at its end
    labels_ = {"alertname": "TrainserveRollout", "model": "m", "candidate": "2", "stable": "1"}
    for body, status in ((started, "firing"), (step, "firing"), (rolled_back, "resolved")):
        assert set(body) == {
            *("version", "groupKey", "truncatedAlerts", "status", "receiver", "groupLabels", "commonLabels"),
            *("commonAnnotations", "externalURL", "alerts"),
        }
        assert (body["version"], body["status"], body["truncatedAlerts"]) == ("4", status, 0)
        assert body["groupKey"] == '{}:{alertname="TrainserveRollout", model="m"}'
        (alert,) = body["alerts"]
        assert set(alert) == {"status", "labels", "annotations", "startsAt", "endsAt", "generatorURL", "fingerprint"}
        assert alert["labels"] == labels_ == body["commonLabels"] and alert["fingerprint"] == fingerprint(labels_)
        assert alert["status"] == status and all(isinstance(v, str) for v in alert["annotations"].values())
    assert started["alerts"][0]["endsAt"] == "0001-01-01T00:00:00Z"  # as Alertmanager sends an alert not ended
    ended = rolled_back["alerts"][0]
    assert ended["startsAt"] == started["alerts"][0]["startsAt"] and ended["endsAt"] != "0001-01-01T00:00:00Z"
    assert ended["annotations"]["event"] == "rolled-back" and "flip_rate: " in ended["annotations"]["description"]


@pytest.mark.unit
def test_alertmanagers_fingerprint_of_a_label_set():
    # prometheus/common model's own cases for LabelSet.Fingerprint(), which Alertmanager sends
    assert fingerprint({}) == "cbf29ce484222325"
    assert fingerprint({"name": "garland, briggs", "fear": "love is not enough"}) == f"{5799056148416392346:016x}"


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("http://a/h", [("http://a/h", None)], id="one"),
        pytest.param(
            "https://a/h, alertmanager+http://b:9093/x", [("https://a/h", None), ("http://b:9093/x", "alertmanager")]
        ),
        pytest.param("generic+https://a", [("https://a", "generic")], id="generic"),
    ],
)
def test_receivers_parse_with_their_format(text, expected):
    assert [(r.url, r.format) for r in parse_receivers(text)] == expected


@pytest.mark.unit
def test_the_receivers_and_their_format_come_from_the_environment_too(monkeypatch):
    monkeypatch.setenv("TRAINSERVE_NOTIFY", "https://a/h,alertmanager+http://b/x")
    monkeypatch.setenv("TRAINSERVE_NOTIFY_FORMAT", "alertmanager")
    config = config_from_args(RolloutConfig, build_parser().parse_args(["rollout"]))
    assert [(r.url, r.format) for r in config.notify] == [("https://a/h", None), ("http://b/x", "alertmanager")]
    assert config.notify_format == "alertmanager"


@pytest.mark.unit
def test_the_sender_retries_no_answer_never_a_4xx_and_leaves_a_stuck_receiver_behind_at_exit():
    flaky, refusing, stuck = parse_receivers("http://flaky/h,http://refusing/h,http://stuck/h")
    failures, reached, released, posts = [OSError("HTTP 503")], threading.Event(), threading.Event(), []

    def post(url: str, body: bytes, timeout: float) -> None:
        posts.append(url)
        if url == flaky.url and failures:
            raise failures.pop()
        if url == refusing.url:
            raise Refused("HTTP 403 Forbidden")
        if url == stuck.url:
            reached.set()
            released.wait()

    sender = Sender((flaky, refusing, stuck), lambda receiver, document: b"{}", post, backoff_s=0.0)
    sender.send({"event": "started"})
    assert reached.wait(30)  # the first two done, the third in flight
    tally = sender.close(within_s=0.2)  # returns although the stuck receiver never answers
    released.set()
    assert (tally.delivered, tally.failed) == (1, 2) and tally.why == "http://refusing/h: HTTP 403 Forbidden"
    assert posts == [flaky.url, flaky.url, refusing.url, stuck.url]  # tried again after no answer, not after 403
