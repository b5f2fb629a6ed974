"""What a person sees of a sweep while it runs (a sweep of many levels takes minutes): one line per level as it
finishes, readable alone, and on a terminal a bar over the levels. The table at the end holds them all.

    load: level 3 of 8: C=4, batch 1: 812.3 requests/s (812.3 examples/s), p50 4.1 ms, p99 9.1 ms, 0 errors,
    accuracy 0.969, stable after 3 windows
"""

from __future__ import annotations

import logging

from trainserve.evaluation.load.measure import Point
from trainserve.evaluation.load.report import point_summary
from trainserve.terminal import progress_bar

log = logging.getLogger(__name__)


def level_words(p: dict) -> str:
    """One measured level (a point as the report holds it) as a person reads it."""
    what = f"C={p['concurrency']}" if p["mode"] == "concurrency" else f"R={p['rate']:g}/s"
    latency = p["latency_ms"] or {}
    ms = ", ".join(f"{k} {latency[k]:.1f} ms" for k in ("p50", "p99") if k in latency) or "no answers"
    quality = p["quality"] or {}
    check = f", accuracy {quality['accuracy']:.3f}" if "accuracy" in quality else ""
    check = f", mae {quality['mae']:.3g}" if "mae" in quality else check
    flag = "stable" if p["stable"] else "UNSTABLE"
    return (
        f"{what}, batch {p['batch_size']}: {p['throughput_rps']:.1f} requests/s ({p['examples_per_s']:.1f} "
        f"examples/s), {ms}, {p['error_count']} errors{check}, {flag} after {p['windows']} windows"
    )


class SweepProgress:
    """Told each level as it finishes; `with` closes the bar."""

    def __init__(self, levels: int, show: bool | None = None):
        self.levels, self.done = levels, 0
        self.bar = progress_bar(levels, "level", "load sweep", show)

    def finished(self, point: Point) -> Point:
        self.done += 1
        words = level_words(point_summary(point))
        log.info("load: level %d of %d: %s", self.done, self.levels, words)
        self.bar.set_postfix_str(words.split(":")[0], refresh=False)
        self.bar.update(1)
        return point

    def __enter__(self) -> SweepProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.bar.close()
