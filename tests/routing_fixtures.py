"""What the routing tests share: serve-local serving three versions of m (stable = 1; 2 with other weights; 3 with
1's weights), a proxy in front of it following a routing file with seeded draws, and readers of its answers and
its metrics page."""

from __future__ import annotations

import json
import random
import urllib.error
import urllib.request

from conftest import DIRECT, install_version
from serving_fixtures import IMAGES, predict_request, running_proxy, serve_every_version, stubs
from trainserve.proxy.routing import ModelRoute, Routing, write_routing
from trainserve.proxy.server import Proxy

SEED = 7


def serve_three_versions(model_versions, root):
    """serve-local with m versions 1 and 2 (different weights) and 3 (1's weights), `stable` = 1."""
    for version, template in ((1, model_versions[0]), (2, model_versions[1]), (3, model_versions[0])):
        install_version(template, root / "m", version)
    flag = "--allow_version_labels_for_unavailable_models"  # the label is read before its version loads
    return serve_every_version(root / "models.config", "m", root / "m", (1, 2, 3), {"stable": 1}, flag)


def proxy_starter(server, tmp_path, proxies: list):
    """start(routing=None, **flags): a proxy in front of `server` following tmp_path/routing.json (written first
    when `routing` is given), its draws seeded, polled only when a test calls `router.poll()`."""

    def start(routing: Routing | None = None, **flags) -> Proxy:
        path = tmp_path / "routing.json"
        if routing is not None:
            write_routing(path, routing)
        proxy = running_proxy(
            server,
            tmp_path / "captures" / "c",
            uniform=random.Random(SEED).random,
            sampling_rate=0.0,
            routing_file=path,
            routing_poll_seconds=3600,  # the tests poll themselves: an edit applies on `router.poll()`
            **flags,
        )
        proxies.append(proxy)
        return proxy

    return start


def route(candidate=2, shadow=0.0, canary=0.0, sticky=None, salt=None) -> Routing:
    return Routing({"m": ModelRoute(candidate, shadow, canary, sticky, salt)})


def answered_by(proxy: Proxy, n: int, metadata=(), **spec) -> list[int]:
    predict, _ = stubs(type("T", (), {"target": f"127.0.0.1:{proxy.port}"}))
    request = predict_request(**({"label": "stable"} | spec))
    return [predict.Predict(request, timeout=30, metadata=metadata).model_spec.version.value for _ in range(n)]


def page(proxy: Proxy) -> dict[str, float]:
    """The proxy's metrics page as {series with labels: value}."""
    with DIRECT.open(f"http://127.0.0.1:{proxy.rest_port}/monitoring/proxy/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line[:1] != "#"}


def requests(counts: dict, **labels) -> float:
    """Sum of :trainserve:proxy:request_count over the series with `labels`."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(
        v for k, v in counts.items() if k.startswith(":trainserve:proxy:request_count{") and all(w in k for w in want)
    )


def rest_predict(base: str, path: str, headers: dict | None = None) -> tuple[int, dict]:
    body = json.dumps({"instances": IMAGES[:2].tolist()}).encode()
    request = urllib.request.Request(f"{base}{path}", body, {"Content-Type": "application/json", **(headers or {})})
    try:
        with DIRECT.open(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())
