"""A rollout on the defaults, on real parts, at a steady 10 requests/s: what the dry run states it takes, and what
it took. Too long for the test suite (the defaults size a plan of about half an hour at this rate, 200 calls a
check and 1-point budgets), so it is measured here, by hand, as the suite's plan `auto` test
(tests/test_rollout_auto_live.py) measures it with loosened budgets.

The site is the live rollout tests' (tests/rollout_live.py): serve-local in this process, the proxy, a real
Prometheus (Debian's `prometheus` on PATH) scraping both every second with the repository's rules. Model m: version
1 stable, version 2 a retrain with the same weights, staged with its eval report; clients call `stable` through the
proxy at --rate from the start, and Prometheus sees --seen seconds of them before the dry run. Then `trainserve
rollout` on the defaults (looks every 30 s) runs to its end. Printed: the dry run's plan lines, the verdict, the
time it took against the stated median, 90th percentile and most (the bake after the promotion included, as the
defaults bake), and the clients' failed calls (none expected).

    python bench/rollout_live_defaults.py [--rate 10] [--seen 300]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from rollout_live import live_site, staged  # noqa: E402
from test_rollout_auto_live import PacedClients, plan_lines, seen  # noqa: E402

from conftest import digits_cnn, export_digits_cnn  # noqa: E402
from trainserve.cli import main as trainserve  # noqa: E402

os.environ.pop("TRAINSERVE_BAKE", None)  # the suite's conftest ends its rollouts at promotion; here the default bakes
from trainserve.rollout.bake import bake_seconds  # noqa: E402
from trainserve.rollout.config_file import history_path  # noqa: E402
from trainserve.rollout.history import read_history  # noqa: E402
from trainserve.rollout.sizing.choose import hours  # noqa: E402


def one_version(root: Path) -> Path:
    """The 8x8x1 CNN the live tests serve, exported once: both versions are this SavedModel (flips on none)."""
    import keras
    import numpy as np

    from trainserve.layout import write_warmup_requests

    keras.utils.set_random_seed(0)
    path = root / "seed0"
    export_digits_cnn(digits_cnn(), path)
    images = np.random.default_rng(0).integers(0, 256, (8, 8, 8, 1), dtype=np.uint8)
    write_warmup_requests(path, "m", {"images": images})
    return path


def rollout_argv(site, report: Path) -> list[str]:
    return [
        *("rollout", "--config", str(site.config), "--report", str(report), "--server", site.server.target),
        *("--routing-file", str(site.routing), "--prometheus", site.prometheus.url, "--wait", "60"),
    ]


def dry_run(argv: list[str]) -> list[str]:
    with contextlib.redirect_stdout(io.StringIO()) as out:
        if trainserve([*argv, "--dry-run"]) != 0:
            raise SystemExit(f"the dry run failed:\n{out.getvalue()}")
    return plan_lines(out.getvalue())


def measure(rate: float, seen_seconds: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        version = one_version(root)
        with live_site(root, {1: version, 2: version}) as site:
            clients = PacedClients(site.proxy, rate)
            try:
                report = staged(site.config, site.base, site.server, 2)
                site.prometheus.wait_for(
                    lambda: seen(site.prometheus) >= seen_seconds, f"{seen_seconds:g} s seen", seen_seconds + 120
                )
                argv = rollout_argv(site, report)
                print("\n".join(dry_run(argv)), flush=True)
                began = time.monotonic()
                code = trainserve(argv)
                took = time.monotonic() - began
            finally:
                clients.close()
            start = next(e for e in read_history(history_path(site.config)) if e.get("event") == "start")
    sizing, bake = start["sizing"], bake_seconds(start)
    most = sizing["most_seconds"] + bake  # the bake follows the promotion whatever the steps took
    print(
        f"exit {code} after {hours(took)}; stated: median {hours(sizing['median_seconds'])}, 90 % "
        f"{hours(sizing['p90_seconds'])}, at most {hours(sizing['most_seconds'])}, then a bake of {hours(bake)} "
        f"({'within' if took <= most else 'BEYOND'} the stated most and the bake)"
    )
    print(f"clients: {len(clients.answers)} answered, {len(clients.errors)} failed {sorted(set(clients.errors))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=10.0, help="the clients' requests per second")
    parser.add_argument("--seen", type=float, default=300.0, help="seconds of calls Prometheus sees first")
    args = parser.parse_args()
    measure(args.rate, args.seen)


if __name__ == "__main__":
    main()
