"""What the proxy counts per version, for the pages Prometheus scrapes: TF Serving exports no version label
(tensorflow/serving#1970), so in front of the real server these are the only series that tell a canary apart from
stable.

- `:trainserve:proxy:request_count{model_name,version,api,status,route}`: answered calls; `version` is the one
  that answered (the response's model_spec.version), or for a failed call the one it was sent to (the candidate
  for a canary, the version it named, else the version last seen answering its label); `status` the gRPC code's
  name (REST: the code TF Serving maps to the HTTP status); `route` stable, canary or direct.
- `:trainserve:proxy:request_latency{model_name,version,api}`: histogram in microseconds, with serve-local's
  buckets (10 x 1.8^i), so one expression reads both.
- shadow: `shadow_requests{outcome}` (see SHADOW_OUTCOMES and trainserve.proxy.shadow), examples compared
  (`shadow_pairs`), of them those compared on a classification output (`shadow_classified_pairs`) and those whose
  class flipped, the sum of absolute differences (regression), the candidate's latency, and what the shadow holds
  (copies, bytes); the routing in force as gauges.
- the flip matrix's rows: `shadow_class_pairs{class}` and `shadow_class_flips{class}`, the classified examples by
  stable's class (its id below shadow_compare.CLASS_LABELS, else `other`) and those that flipped; both series of a
  class appear together, at its first example.
- with the route's `shadow_tolerance` (regression): `shadow_tolerated_pairs`, the examples compared against it,
  and `shadow_beyond_tolerance`, those with an element differing from stable's by more.
"""

from __future__ import annotations

import threading
from collections import Counter

from trainserve.exposition import UNKNOWN_MODEL, Histogram, header, label_set
from trainserve.proxy.shadow_compare import Comparison

P = ":trainserve:proxy:"
REQUEST_COUNT, REQUEST_LATENCY = P + "request_count", P + "request_latency"
SHADOW_REQUESTS, SHADOW_PAIRS, SHADOW_FLIPS = P + "shadow_requests", P + "shadow_pairs", P + "shadow_flips"
SHADOW_CLASSIFIED_PAIRS, SHADOW_ABS_DIFF_SUM = P + "shadow_classified_pairs", P + "shadow_abs_diff_sum"
SHADOW_CLASS_PAIRS, SHADOW_CLASS_FLIPS = P + "shadow_class_pairs", P + "shadow_class_flips"
SHADOW_TOLERATED_PAIRS, SHADOW_BEYOND_TOLERANCE = P + "shadow_tolerated_pairs", P + "shadow_beyond_tolerance"
SHADOW_LATENCY, SHADOW_QUEUED, SHADOW_HELD_BYTES = P + "shadow_latency", P + "shadow_queued", P + "shadow_held_bytes"
CANARY_PERCENT, SHADOW_PERCENT = P + "canary_percent", P + "shadow_percent"
ROUTING_RELOADS, ROUTING_REFUSED = P + "routing_reloads", P + "routing_refused"
SHADOW_OUTCOMES = ("compared", "incomparable", "shed", "dropped_queue_full", "error", "cut")


class ProxyMetrics:
    """Counts the request threads (REST) and the event loop (gRPC, shadow) add to; `lines()` is the page."""

    REQUEST_LABELS = ("model_name", "version", "api", "status", "route")
    SHADOW_LABELS = ("model_name", "version")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter = Counter()
        self.shadow: Counter = Counter()  # (model, candidate, outcome)
        self.pairs: Counter = Counter()  # (model, candidate)
        self.classified: Counter = Counter()
        self.flips: Counter = Counter()
        self.abs_diff: Counter = Counter()
        self.class_pairs: Counter = Counter()  # (model, candidate, stable's class label)
        self.class_flips: Counter = Counter()
        self.tolerated: Counter = Counter()  # (model, candidate)
        self.beyond: Counter = Counter()
        self.latency = Histogram(
            REQUEST_LATENCY, "Wall time (microseconds) of calls through the proxy.", ("model_name", "version", "api")
        )
        self.shadow_latency = Histogram(SHADOW_LATENCY, "Wall time (microseconds) of shadow calls.", self.SHADOW_LABELS)
        self.queued = self.held_bytes = lambda: 0  # the shadow's copies queued, bytes held: set by the shadow
        self.router = None  # trainserve.proxy.router.Router, set by the proxy
        self.label_versions: dict[tuple[str, str], str] = {}  # (model, label) -> the version last seen answering it
        self._answered: set[tuple[str, str | None]] = set()  # (model, version) and (model, None) that answered

    def request(self, model: str, version: str, api: str, status: str, route: str, micros: float) -> None:
        """Count one call. Names come from clients, so a failed call is counted under its model and version only
        once they have answered a call (or are routed): others go to UNKNOWN_MODEL / "", and the page cannot grow
        without bound (serve-local does the same for its request_count)."""
        with self._lock:
            if status == "OK":
                self._answered.add((model, version))
                self._answered.add((model, None))
            else:
                model, version = self._bounded(model, version)
            self.requests[(model, version, api, status, route)] += 1
        self.latency.observe(micros, model, version, api)

    def _bounded(self, model: str, version: str) -> tuple[str, str]:
        route = self.router.routing.route(model) if self.router is not None else None
        if (model, None) not in self._answered and route is None:
            return UNKNOWN_MODEL, ""
        if (model, version) in self._answered or (route is not None and str(route.candidate) == version):
            return model, version
        return model, ""

    def shadow_outcome(self, model: str, version: int, outcome: str) -> None:
        with self._lock:
            self.shadow[(model, str(version), outcome)] += 1

    def compared(self, model: str, version: int, comparison: Comparison, micros: float) -> None:
        key = (model, str(version))
        with self._lock:
            self.shadow[(*key, "compared")] += 1
            self.pairs[key] += comparison.pairs
            self.classified[key] += comparison.classified
            self.flips[key] += comparison.flips
            self.abs_diff[key] += comparison.abs_diff
            for label, n in comparison.class_pairs.items():
                self.class_pairs[(*key, label)] += n
                self.class_flips[(*key, label)] += comparison.class_flips[label]
            if comparison.tolerated:
                self.tolerated[key] += comparison.tolerated
                self.beyond[key] += comparison.beyond
        self.shadow_latency.observe(micros, *key)

    def lines(self) -> list[str]:
        with self._lock:
            requests, shadow = sorted(self.requests.items()), dict(self.shadow)
            pairs, classified = dict(self.pairs), dict(self.classified)
            flips, abs_diff = dict(self.flips), dict(self.abs_diff)
        out = header(REQUEST_COUNT, "counter", "Calls answered through the proxy, by the version that answered.")
        out += [f"{REQUEST_COUNT}{label_set(self.REQUEST_LABELS, k)} {n}" for k, n in requests]
        out += self.latency.lines()
        out += header(
            SHADOW_REQUESTS,
            "counter",
            "Shadow copies of stable requests, by outcome (version: the candidate's); dropped_queue_full: over the "
            "queue's bound in copies or in bytes.",
        )
        models = sorted({k[:2] for k in shadow} | set(pairs))
        for key in models:  # every outcome, 0 included: a rate over a missing series is no rate at all
            out += [
                f"{SHADOW_REQUESTS}{label_set((*self.SHADOW_LABELS, 'outcome'), (*key, o))} {shadow.get((*key, o), 0)}"
                for o in SHADOW_OUTCOMES
            ]
        for name, counts, text in (
            (SHADOW_PAIRS, pairs, "Examples compared between stable's answer and the shadow's."),
            (SHADOW_CLASSIFIED_PAIRS, classified, "Compared examples with at least one classification output."),
            (SHADOW_FLIPS, flips, "Compared examples whose predicted class differs in a classification output."),
            (SHADOW_ABS_DIFF_SUM, abs_diff, "Sum of |candidate - stable| over compared outputs (regression)."),
        ):
            out += header(name, "counter", text)
            out += [f"{name}{label_set(self.SHADOW_LABELS, k)} {counts.get(k, 0)!r}" for k in models]
        out += self._compared_lines()
        out += self.shadow_latency.lines()
        out += header(SHADOW_QUEUED, "gauge", "Shadow copies waiting to be sent.") + [
            f"{SHADOW_QUEUED} {self.queued()}"
        ]
        out += header(
            SHADOW_HELD_BYTES,
            "gauge",
            "Bytes of the shadow copies queued or being sent: requests and stable's answers.",
        ) + [f"{SHADOW_HELD_BYTES} {self.held_bytes()}"]
        return out + self._routing_lines()

    def _compared_lines(self) -> list[str]:
        """The flip matrix's rows by stable's class, and the examples beyond the route's tolerance."""
        with self._lock:
            class_pairs, class_flips = sorted(self.class_pairs.items()), dict(self.class_flips)
            tolerated, beyond = sorted(self.tolerated.items()), dict(self.beyond)
        labels, out = (*self.SHADOW_LABELS, "class"), []
        for name, text, counts in (
            (SHADOW_CLASS_PAIRS, "Classified examples compared, by stable's class.", dict(class_pairs)),
            (SHADOW_CLASS_FLIPS, "Classified examples whose class flipped, by stable's class.", class_flips),
        ):
            out += header(name, "counter", text)
            out += [f"{name}{label_set(labels, k)} {counts.get(k, 0)}" for k, _ in class_pairs]
        for name, text, counts in (
            (SHADOW_TOLERATED_PAIRS, "Examples compared against the route's shadow_tolerance.", dict(tolerated)),
            (SHADOW_BEYOND_TOLERANCE, "Examples differing from stable's by more than shadow_tolerance.", beyond),
        ):
            out += header(name, "counter", text)
            out += [f"{name}{label_set(self.SHADOW_LABELS, k)} {counts.get(k, 0)}" for k, _ in tolerated]
        return out

    def _routing_lines(self) -> list[str]:
        router = self.router
        if router is None:
            return []
        out = header(CANARY_PERCENT, "gauge", "Share of stable requests the candidate answers, from the routing file.")
        routes = sorted(router.routing.models.items())
        out += [
            f"{CANARY_PERCENT}{label_set(self.SHADOW_LABELS, (m, r.candidate))} {r.canary_percent:g}" for m, r in routes
        ]
        out += header(
            SHADOW_PERCENT, "gauge", "Share of stable requests also sent to the candidate, from the routing file."
        )
        out += [
            f"{SHADOW_PERCENT}{label_set(self.SHADOW_LABELS, (m, r.candidate))} {r.shadow_percent:g}" for m, r in routes
        ]
        out += header(ROUTING_RELOADS, "counter", "Routing file contents read, by outcome (applied, refused).")
        out += [f'{ROUTING_RELOADS}{{outcome="{o}"}} {n}' for o, n in sorted(router.reloads.items())]
        out += header(
            ROUTING_REFUSED, "gauge", "1 while the routing file on disk is refused and the previous routing kept."
        )
        return out + [f"{ROUTING_REFUSED} {int(router.refused is not None)}"]
