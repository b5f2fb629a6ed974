"""The routing file: which candidate version the proxy shadows and gives a share of `stable` requests.

One JSON file, written atomically (`write_routing`) by `trainserve rollout` or by a person, read by every replica of
the proxy on each poll, as TF Serving polls its model config: all replicas follow one state, and a restart keeps it.
Writers that change one model's route take the lock beside it (`update_routing`), so two controllers of two models
never undo each other.

    {"schema": "trainserve.routing/1",
     "models": {"digits": {"candidate": 7,             # the version shadowed / given a share
                           "shadow_percent": 100,      # share of `stable` requests also sent to the candidate
                           "canary_percent": 5,        # share of `stable` requests answered by the candidate
                           "sticky_header": "x-user-id",    # optional: one caller (header value), one version
                           "sticky_salt": "digits:7",       # optional: salts that hash (default model:candidate)
                           "shadow_tolerance": 0.8}}}       # optional: a regression copy's answer differing from
                                                            # stable's by more is counted (the rollout sets it)

Only requests addressed to the version label `stable` are routed, and, for a model the file routes, requests that
name neither a version nor a label: TF Serving would answer those with its highest version (the candidate, once
staged), so the proxy sends them as `stable` requests (a proxy default). A request naming a version or another
label passes through untouched. An absent file means no routing. A file that does not parse, or breaks a rule here,
is refused with one line naming what was expected (`RoutingError`), and the proxy keeps the routing it runs (none,
when it starts on it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trainserve.errors import TrainserveError
from trainserve.files import locked, write_file_atomic
from trainserve.proxy.wire import MAX_VERSION

log = logging.getLogger(__name__)

SCHEMA = "trainserve.routing/1"
STABLE_LABEL = "stable"
_MODEL_KEYS = frozenset(
    {"candidate", "shadow_percent", "canary_percent", "sticky_header", "sticky_salt", "shadow_tolerance"}
)
_OPTIONAL_KEYS = ("sticky_header", "sticky_salt", "shadow_tolerance")  # left out of the file when None


class RoutingError(TrainserveError):
    """A routing file that cannot be followed; the message is one line naming what was expected."""


@dataclass(frozen=True)
class ModelRoute:
    """How `stable` requests for one model are routed."""

    candidate: int  # the version shadowed and given `canary_percent` of the requests
    shadow_percent: float = 0.0  # 0-100: share of `stable` requests answered by stable also sent to the candidate
    canary_percent: float = 0.0  # 0-100: share of `stable` requests the candidate answers instead
    sticky_header: str | None = None  # header whose value decides the share, so one caller sees one version
    sticky_salt: str | None = None  # salts the callers' hash; None: default_sticky_salt(model, candidate)
    shadow_tolerance: float | None = None  # regression: a copy's answer beyond this from stable's is counted

    def check(self, model: str) -> None:
        where = f"routing for model {model!r}"
        if (
            isinstance(self.candidate, bool)
            or not isinstance(self.candidate, int)
            or not 0 <= self.candidate <= MAX_VERSION
        ):
            raise RoutingError(
                f"{where}: candidate {self.candidate!r}: expected a version number (an integer from 0 to 2**63-1)"
            )
        for name in ("shadow_percent", "canary_percent"):
            value = getattr(self, name)
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or not math.isfinite(value) or not 0 <= value <= 100:
                raise RoutingError(f"{where}: {name} {value!r}: expected a percentage between 0 and 100")
        if self.sticky_header is not None and (not isinstance(self.sticky_header, str) or not self.sticky_header):
            raise RoutingError(f"{where}: sticky_header {self.sticky_header!r}: expected a header name")
        if self.sticky_salt is not None and (not isinstance(self.sticky_salt, str) or not self.sticky_salt):
            raise RoutingError(f"{where}: sticky_salt {self.sticky_salt!r}: expected a non-empty string")
        tolerance = self.shadow_tolerance
        number = isinstance(tolerance, (int, float)) and not isinstance(tolerance, bool)
        if tolerance is not None and not (number and math.isfinite(tolerance) and tolerance >= 0):
            raise RoutingError(f"{where}: shadow_tolerance {tolerance!r}: expected a finite number, 0 or more")

    def salt(self, model: str) -> str:
        """What the callers' hash is salted with: the file's `sticky_salt`, else the model's and candidate's."""
        return self.sticky_salt if self.sticky_salt is not None else default_sticky_salt(model, self.candidate)

    def canary_share(self, model: str, sticky_value: str | bytes | None, draw: float) -> bool:
        """Whether this request goes to the candidate: by the caller's salted hash when sticky and the caller sent
        the header (a caller in the share at 5 % stays in it at 25 %), else by `draw` (uniform in [0, 1))."""
        if self.canary_percent <= 0:
            return False
        sticky = self.sticky_header and sticky_value is not None
        point = sticky_point(self.salt(model), sticky_value) if sticky else draw
        return point * 100 < self.canary_percent


def default_sticky_salt(model: str, candidate: int) -> str:
    """The salt of a route that names none: one per model and candidate, so that the callers in one model's canary
    are not the callers in every model's canary, nor in the next candidate's."""
    return f"{model}:{candidate}"


def sticky_point(salt: str, value: str | bytes) -> float:
    """A caller's fixed point in [0, 1): the first 8 bytes of SHA-256(salt, a zero byte, value), big-endian, over
    2**64; the same in every replica and after every restart (not Python's hash). `value` is bytes for a binary
    (`-bin`) gRPC metadata key."""
    data = value if isinstance(value, bytes) else value.encode("utf-8", "surrogateescape")
    digest = hashlib.sha256(salt.encode("utf-8", "surrogateescape") + b"\0" + data).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


@dataclass(frozen=True)
class Routing:
    """The whole file: a route per model name; a model not named is not routed."""

    models: dict[str, ModelRoute] = field(default_factory=dict)

    def route(self, model: str) -> ModelRoute | None:
        return self.models.get(model)

    def check(self) -> None:
        for model, route in self.models.items():
            if not isinstance(model, str) or not model:
                raise RoutingError(f"routing: model name {model!r}: expected a non-empty name")
            route.check(model)

    def to_json(self) -> dict:
        models = {}
        for model, route in sorted(self.models.items()):
            entry = asdict(route)
            models[model] = {k: v for k, v in entry.items() if not (k in _OPTIONAL_KEYS and v is None)}
        return {"schema": SCHEMA, "models": models}


NO_ROUTING = Routing()


def parse_routing(text: str | bytes, where: str = "routing file") -> Routing:
    """A routing file's text, checked; raises RoutingError (one line) on anything it cannot follow."""
    try:
        document = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RoutingError(f"{where}: not JSON ({exc}): expected {{'schema': '{SCHEMA}', 'models': {{...}}}}") from None
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        found = document.get("schema") if isinstance(document, dict) else type(document).__name__
        raise RoutingError(f"{where}: schema {found!r}: expected {SCHEMA!r}")
    models = document.get("models", {})
    if not isinstance(models, dict):
        raise RoutingError(f"{where}: models {models!r}: expected an object of model name -> route")
    routes = {}
    for model, entry in models.items():
        if not isinstance(entry, dict) or "candidate" not in entry:
            raise RoutingError(f"{where}: model {model!r}: expected an object with a candidate version")
        unknown = sorted(set(entry) - _MODEL_KEYS)
        if unknown:
            raise RoutingError(f"{where}: model {model!r}: unknown key(s) {unknown}: expected {sorted(_MODEL_KEYS)}")
        routes[model] = ModelRoute(**entry)
    routing = Routing(routes)
    try:
        routing.check()
    except RoutingError as exc:
        raise RoutingError(f"{where}: {exc}") from None
    return routing


def routing_bytes(path: Path) -> bytes | None:
    """The routing file's bytes, None when it does not exist; RoutingError (one line) when it cannot be read."""
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise RoutingError(f"routing file {path}: cannot read it ({exc.strerror}): expected a readable file") from None


def read_routing(path: Path) -> Routing:
    """The routing file at `path`, checked; NO_ROUTING when it does not exist."""
    text = routing_bytes(path)
    return NO_ROUTING if text is None else parse_routing(text, f"routing file {path}")


def write_routing(path: Path, routing: Routing) -> Path:
    """Check `routing` and write it atomically: a proxy polling the file sees the old routing or the new, whole."""
    routing.check()
    return write_file_atomic(Path(path), (json.dumps(routing.to_json(), indent=2) + "\n").encode())


def routing_with(routing: Routing, model: str, route: ModelRoute | None) -> Routing:
    """`routing` with `model`'s route replaced (None: the model no longer routed); the others unchanged."""
    models = {name: r for name, r in routing.models.items() if name != model}
    if route is not None:
        models[model] = route
    return Routing(models)


def update_routing(
    path: Path,
    model: str,
    change: Callable[[ModelRoute | None], ModelRoute | None],
    replace_broken: bool = False,
) -> Routing:
    """`model`'s route becomes `change(its route now)` (None: no longer routed) in the file at `path`, the other
    models' routes kept, under an flock on `.<name>.lock` beside it: two writers of two models never undo each
    other. A file that cannot be followed raises RoutingError, or with `replace_broken` (a rollback must not wait
    on it) counts as no routing. Returns the routing now in the file; an update that changes nothing writes
    nothing."""
    path = Path(path)
    with locked(path):
        try:
            routing, broken = read_routing(path), False
        except RoutingError as exc:
            if not replace_broken:
                raise
            log.error("%s: replaced by a file without routes", exc)
            routing, broken = NO_ROUTING, True
        updated = routing_with(routing, model, change(routing.route(model)))
        if updated != routing or broken:
            write_routing(path, updated)
    return updated
