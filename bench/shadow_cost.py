"""What shadowing costs the client: p50/p99 latency and throughput of `stable` requests direct, through
`trainserve proxy` alone, and through it with every request shadowed to a second version, in one run.

Two versions of the small CNN of bench/eval_throughput.py (28x28x1 uint8) on serve-local, `stable` = 1;
`trainserve proxy` in a process of its own, with no routing file, then with one that shadows 100 % of `stable`
requests to version 2 (the most shadow can cost: the server does every request twice on the same CPUs). The
client is this script's own (trainserve's `load` sends `x-trainserve-origin`, which the proxy never routes): batch
256 in a closed loop (4 threads: throughput), then, once the shadow has sent or shed every copy of that phase,
batch 1 in an open loop at a moderate rate (latency from the scheduled send time), in short windows that alternate
between the paths so that whatever else the machine runs falls on each alike. The first round warms up and is
dropped; figures are medians over rounds. Targets (issue 46, 50): shadow's p99 within 2 ms of capture alone at
batch 1; shadow >= 0.8 x direct examples/s at batch 256 (on a machine whose CPUs the doubled inference does not
saturate). The copies shed (the proxy's latency rule, --shadow-shed-latency-margin, and its in-flight ceiling,
--shadow-shed-in-flight) are printed beside the p99 added, with their share of the copies offered. Each `--shadow`
adds a shadowing proxy with its own flags, measured in the same alternating windows, so that two shed rules are
compared on the same machine at the same moments. `--replicas N` makes each of them N proxies in front of the one
server, the clients' calls spread over them, as replicas behind a Service are: each replica's copies then slow the
others' calls. The route has no shadow share through the warm-up round (the calls every replica's shed rule takes
as quiet), then the share given, read within the proxies' 1 s routing poll.

    python bench/shadow_cost.py [--rounds 3] [--rate 100] [--window-s 2] [--windows 4] [--replicas 1]
                                [--shadow '--shadow-shed-in-flight 1' --shadow '' ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
from capture_cost import wait_ready
from loopback import DIRECT, free_port, start_serve_local, train_bench_model

from trainserve.protos import predict_pb2
from trainserve.proxy.routing import ModelRoute, Routing, write_routing
from trainserve.tensors import to_tensor_proto

PREDICT = "/tensorflow.serving.PredictionService/Predict"


def request(input_key: str, batch: int) -> bytes:
    message = predict_pb2.PredictRequest()
    message.model_spec.name, message.model_spec.version_label = "bench", "stable"
    images = np.random.default_rng(batch).integers(0, 256, (batch, 28, 28, 1), dtype=np.uint8)
    to_tensor_proto(images, into=message.inputs[input_key])
    return message.SerializeToString()


def closed_loop(targets: list[str], body: bytes, batch: int, window_s: float, threads: int = 4) -> float:
    """Examples/s of `threads` clients each sending as soon as its last answer came, spread over `targets`."""
    done, stop = [0] * threads, threading.Event()

    def client(i: int) -> None:
        with grpc.insecure_channel(targets[i % len(targets)]) as channel:
            call = channel.unary_unary(PREDICT)
            while not stop.is_set():
                call(body, timeout=60)
                done[i] += batch

    workers = [threading.Thread(target=client, args=(i,)) for i in range(threads)]
    start = time.perf_counter()
    for worker in workers:
        worker.start()
    stop.wait(window_s)
    stop.set()
    for worker in workers:
        worker.join()
    return sum(done) / (time.perf_counter() - start)


def open_loop(targets: list[str], body: bytes, rate: float, window_s: float) -> list[float]:
    """Latency (ms) of each request, from its scheduled (Poisson) send time to its answer; the requests take
    `targets` in turn."""
    rng, latencies, lock = np.random.default_rng(0), [], threading.Lock()
    channels = [grpc.insecure_channel(target) for target in targets]
    try:
        calls = [channel.unary_unary(PREDICT) for channel in channels]
        for call in calls:
            call(body, timeout=60)  # connected before the clock starts

        def send(call, scheduled: float) -> None:
            call(body, timeout=60)
            with lock:
                latencies.append((time.perf_counter() - scheduled) * 1000)

        start, at, senders = time.perf_counter(), 0.0, []
        while at < window_s:
            at += rng.exponential(1 / rate)
            delay = start + at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)  # pacing the open loop's arrivals, not synchronisation
            sender = threading.Thread(target=send, args=(calls[len(senders) % len(calls)], start + at))
            sender.start()
            senders.append(sender)
        for sender in senders:
            sender.join()
    finally:
        for channel in channels:
            channel.close()
    return latencies


def start_proxy(
    tmp: Path, upstream: str, upstream_rest: str, routing: Path | None, *flags: str
) -> tuple[subprocess.Popen, str, str]:
    """`trainserve proxy` in its own process: (process, gRPC target, its metrics page's URL)."""
    port, rest_port = free_port(), free_port()
    command = [sys.executable, "-m", "trainserve", "proxy", "--upstream", upstream, "--port", str(port)]
    command += ["--upstream-rest", upstream_rest, "--rest-port", str(rest_port)]
    command += ["--filename-prefix", str(tmp / "captures" / "bench"), *flags]
    command += ["--sampling-rate", "0"] + (["--routing-file", str(routing)] if routing else [])
    with open(tmp / f"capture-{port}.log", "w") as out:
        proxy = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    target = f"127.0.0.1:{port}"
    grpc.channel_ready_future(grpc.insecure_channel(target)).result(timeout=120)
    return proxy, target, f"http://127.0.0.1:{rest_port}/monitoring/proxy/metrics"


def proxy_page(page: str) -> dict[str, float]:
    """A proxy's metrics page: value by series (name and labels as written)."""
    with DIRECT.open(page, timeout=30) as answer:
        lines = answer.read().decode().splitlines()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines if not line.startswith("#")}


def shadow_outcomes(pages: list[str]) -> dict[str, float]:
    """The shadow copies' outcomes, summed over models and replicas, from the proxies' metrics pages."""
    outcomes: dict[str, float] = {}
    for series, value in ((s, v) for page in pages for s, v in proxy_page(page).items()):
        if series.startswith(":trainserve:proxy:shadow_requests{"):
            outcome = series.split('outcome="')[1].split('"')[0]
            outcomes[outcome] = outcomes.get(outcome, 0) + value
    return outcomes


def wait_shadow_idle(pages: list[str], timeout_s: float = 120) -> None:
    """Until the shadows hold no copy (none queued, none being sent): one phase's copies are that phase's cost."""
    deadline = time.monotonic() + timeout_s
    while any(proxy_page(page).get(":trainserve:proxy:shadow_held_bytes", 0) > 0 for page in pages):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the shadow still held copies after {timeout_s:g} s")
        time.sleep(0.05)  # polling a process's page: no event crosses the process boundary


def cpu() -> str:
    """The CPU's model name and whether it has AVX-512, from /proc/cpuinfo."""
    info = Path("/proc/cpuinfo").read_text()
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    return f"{model}, AVX-512 {'yes' if ' avx512f' in info else 'no'}"


def serve_two_versions(tmp: Path) -> tuple[subprocess.Popen, int, int]:
    train_bench_model(tmp, seed=0)
    train_bench_model(tmp, seed=1)
    config = tmp / "models.config"
    config.write_text(
        'model_config_list { config { name: "bench" base_path: "%s" model_platform: "tensorflow" '
        'model_version_policy { all {} } version_labels { key: "stable" value: 1 } } }\n' % (tmp / "models" / "bench")
    )
    return start_serve_local(
        tmp / "serve.log", f"--model_config_file={config}", "--allow_version_labels_for_unavailable_models"
    )


def input_key(rest: str) -> str:
    with DIRECT.open(f"{rest}/v1/models/bench/versions/1/metadata", timeout=30) as answer:
        signature = json.loads(answer.read())["metadata"]["signature_def"]["signature_def"]["serving_default"]
    (key,) = signature["inputs"]
    return key


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds over the paths (after one warm-up)")
    parser.add_argument("--rate", type=float, default=100, help="batch-1 requests/s (open loop)")
    parser.add_argument("--window-s", type=float, default=2.0, help="each measurement's window")
    parser.add_argument("--windows", type=int, default=4, help="batch-1 windows per path and round, alternating")
    parser.add_argument("--shadow-percent", type=float, default=100, help="share of stable requests shadowed")
    parser.add_argument("--replicas", type=int, default=1, help="proxies per shadowing path, in front of one server")
    parser.add_argument(
        "--shadow",
        action="append",
        metavar="FLAGS",
        help="a shadowing proxy's own flags, e.g. '--shadow-shed-in-flight 1'; repeat to compare several in one run "
        "(default: one proxy with the defaults)",
    )
    args = parser.parse_args()
    args.shadow = args.shadow or [""]
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        server, port, rest_port = serve_two_versions(tmp)
        routing = write_routing(tmp / "routing.json", Routing({"bench": ModelRoute(2, shadow_percent=0)}))
        processes = [server]
        try:
            wait_ready(f"http://127.0.0.1:{rest_port}")
            key = input_key(f"http://127.0.0.1:{rest_port}")
            upstream, upstream_rest = f"127.0.0.1:{port}", f"127.0.0.1:{rest_port}"
            capture, capture_target, _ = start_proxy(tmp, upstream, upstream_rest, None)
            processes.append(capture)
            targets, pages = {"direct": [f"127.0.0.1:{port}"], "capture": [capture_target]}, {}
            for i, flags in enumerate(args.shadow):
                name = f"shadow {i + 1}"
                targets[name], pages[name] = [], []
                for _ in range(args.replicas):
                    shadow, target, page = start_proxy(
                        tmp, upstream, upstream_rest, routing, "--routing-poll-seconds", "1", *flags.split()
                    )
                    processes.append(shadow)
                    targets[name].append(target)
                    pages[name].append(page)
            shadowing = Routing({"bench": ModelRoute(2, shadow_percent=args.shadow_percent)})
            seen, batch_1 = measure(
                targets, request(key, 256), request(key, 1), pages, lambda: write_routing(routing, shadowing), args
            )
            outcomes = {name: shadow_outcomes(page) for name, page in pages.items()}
        finally:
            for process in processes:
                process.terminate()
                process.wait(timeout=120)
    report(seen, batch_1, outcomes, args)


def measure(
    targets: dict[str, list[str]], big: bytes, one: bytes, pages: dict[str, list[str]], shadow: Callable, args
) -> tuple[dict, dict]:
    """Per path: examples/s at batch 256 and batch-1 p50/p99, one figure per round after the warm-up; and per
    shadowing path, the outcomes of the copies of the batch-1 windows of those rounds. `shadow()`, after the
    warm-up, gives the route its shadow share."""
    seen = {name: {"ex/s": [], "p50": [], "p99": []} for name in targets}
    batch_1 = {name: {} for name in pages}
    for round_ in range(args.rounds + 1):
        if round_ == 1:
            shadow()
            time.sleep(2.0)  # the proxies' 1 s routing poll: no event crosses the process boundary
        order = list(targets) if round_ % 2 == 0 else list(reversed(targets))
        throughput = {name: closed_loop(targets[name], big, 256, args.window_s) for name in order}
        before = {name: idle_outcomes(page) for name, page in pages.items()}
        latencies = {name: [] for name in targets}
        for window in range(args.windows):
            for name in order if window % 2 == 0 else reversed(order):
                latencies[name] += open_loop(targets[name], one, args.rate, args.window_s)
        if round_:
            for name in targets:
                seen[name]["ex/s"].append(throughput[name])
                seen[name]["p50"].append(float(np.percentile(latencies[name], 50)))
                seen[name]["p99"].append(float(np.percentile(latencies[name], 99)))
            for name, page in pages.items():
                for outcome, n in idle_outcomes(page).items():
                    batch_1[name][outcome] = batch_1[name].get(outcome, 0) + n - before[name].get(outcome, 0)
    return seen, batch_1


def idle_outcomes(pages: list[str]) -> dict[str, float]:
    """The shadows' outcomes once they hold no copy."""
    wait_shadow_idle(pages)
    return shadow_outcomes(pages)


def report(seen: dict, batch_1: dict[str, dict[str, float]], outcomes: dict[str, dict[str, float]], args) -> None:
    m = {name: {k: statistics.median(v) for k, v in figures.items()} for name, figures in seen.items()}
    cpus = len(os.sched_getaffinity(0))
    shadowed = f"shadow: {args.shadow_percent:g} % to version 2, {args.replicas} prox(ies) per shadowing path"
    print(f"\nsmall CNN, 28x28x1 uint8, {cpus} CPUs ({cpu()}), loopback; {shadowed}")
    for name, f in m.items():
        print(
            f"  {name:<8} batch 256: {f['ex/s']:8.0f} ex/s   batch 1 at {args.rate:g}/s: "
            f"p50 {f['p50']:6.2f} ms  p99 {f['p99']:6.2f} ms"
        )
    print(f"  batch 256, 4 in flight: capture / direct = {m['capture']['ex/s'] / m['direct']['ex/s']:.2f}")
    for (name, counts), flags in zip(outcomes.items(), args.shadow):
        ones = batch_1[name]
        print(
            f"  {name} ({flags or 'defaults'}): batch 1: p99 - capture's = {m[name]['p99'] - m['capture']['p99']:+.2f} "
            f"ms (target <= 2 ms), shed {ones.get('shed', 0):.0f} of {sum(ones.values()):.0f} copies "
            f"({shed_share(ones):.0%}); batch 256: shadow / direct = {m[name]['ex/s'] / m['direct']['ex/s']:.2f} "
            "(target >= 0.8)"
        )
        every = ", ".join(f"{o} {n:.0f}" for o, n in sorted(counts.items()))
        print(f"    all copies, warm-up and batch 256 included: {every}")
    print(f"  (medians of {args.rounds} rounds after a warm-up round; batch 1: {args.windows} windows per round)")


def shed_share(counts: dict[str, float]) -> float:
    """The share of the copies offered that were shed (0 when none was offered)."""
    return counts.get("shed", 0) / max(1.0, sum(counts.values()))


if __name__ == "__main__":
    main()
