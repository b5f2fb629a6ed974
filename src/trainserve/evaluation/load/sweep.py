"""`trainserve load`: the served model's capacity, swept over concurrency (closed loop) and request rate
(open loop, Poisson arrivals) for each batch size, each point measured until stable (measure.py).

Wait for the model -> read its signature -> build the requests (held-out data through the eval's plan,
so that answers are checked against labels as they arrive; or synthetic inputs from the signature's
dtypes and shapes) before any Predict -> one point after another, all pinned to the version the target names
(the one behind --label as GetModelMetadata resolves it, else --version, else the newest AVAILABLE) -> the
report (report.py): the best throughput within the latency budget.
"""

from __future__ import annotations

from trainserve.client import ServingClient, Target
from trainserve.evaluation.load.config import LoadConfig
from trainserve.evaluation.load.inputs import PREDICT_METHOD, Inputs, LoadResult, build_inputs
from trainserve.evaluation.load.measure import Load, Point, measure
from trainserve.evaluation.load.report import build_load_report
from trainserve.evaluation.load.sweep_progress import SweepProgress


def run_sweep(config: LoadConfig) -> LoadResult:
    """The whole sweep (or, with --during, one load around a command: during.py); raises TrainserveError with a
    one-line message on bad input, before any Predict."""
    config.check()
    if config.during is not None:
        from trainserve.evaluation.load.during import run_during

        return run_during(config)
    target = Target(config.model, config.version, config.label, config.signature)
    client = ServingClient(config.server, tls=config.tls, timeout=config.timeout, origin=config.origin)
    try:
        version = client.wait_until_available(target, config.wait)  # the version every point pins
        signature = client.signature(target, version)
        inputs = build_inputs(config, client, signature, target, version)
        call = client.channel.unary_unary(PREDICT_METHOD)  # bytes in, bytes out: pre-serialized requests
        levels = [
            (mode, value, batch_size)
            for batch_size in config.batch_sizes
            for mode, values in (("concurrency", config.concurrencies), ("rate", config.rates))
            for value in values
        ]
        with SweepProgress(len(levels)) as progress:  # a line per level as it ends, a bar on a terminal
            points = [progress.finished(_measure_point(config, call, inputs, *level)) for level in levels]
    finally:
        client.close()
    report = build_load_report(config, version, inputs.data_name, points)
    return LoadResult(report, config.latency_budget_ms is None or report["best"] is not None)


def _measure_point(config: LoadConfig, call, inputs: Inputs, mode: str, value: float, batch_size: int) -> Point:
    load = Load(call, inputs.requests[batch_size], config.timeout, seed=config.seed)
    if mode == "concurrency":
        load.concurrency = int(value)
    else:
        load.rate = value
    measured = measure(load, inputs.plan is not None, config.window_s, config.max_windows, config.stability_latency)
    return Point(mode, value, batch_size, config.window_s, measured, inputs.check(measured.answers))
