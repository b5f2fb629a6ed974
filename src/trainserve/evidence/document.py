"""A report as a document: read once, strict JSON, checked against its published schema (an eval report, or
the replay report promote may also judge).

Promote judges the bytes it read, and the history records their SHA-256: reading the file a second time for
the digest could digest another file than the one judged. JSON's NaN and Infinity are not JSON (RFC 8259):
a report holding them is refused, as a strict parser in a CI job would refuse it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

from trainserve.errors import TrainserveError

SCHEMA_ID = "trainserve.eval/4"  # /3 plus evidence (what the report proves; fields are only added)
SCHEMA_PATH = Path(__file__).with_name("eval_report.schema.json")
REPLAY_SCHEMA_PATH = Path(__file__).parents[1] / "replay" / "replay_report.schema.json"


@dataclass(frozen=True)
class ReadReport:
    """A report as judged: the parsed document and the SHA-256 of exactly the bytes parsed."""

    path: Path
    report: dict
    sha256: str


def read_report(path: Path) -> ReadReport:
    """The eval report at `path`, strict JSON, valid against the schema; else one line naming what is wrong."""
    return read_document(path, "eval", SCHEMA_PATH)


def read_replay_report(path: Path) -> ReadReport:
    """The replay report at `path` (trainserve replay --report), read as strictly as an eval report."""
    return read_document(path, "replay", REPLAY_SCHEMA_PATH)


def read_document(path: Path, kind: str, schema: Path) -> ReadReport:
    """A `kind` report (eval, replay) at `path`: strict JSON, valid against `schema`; else one line."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise TrainserveError(
            f"{kind} report {path} cannot be read ({exc.strerror}): expected what `trainserve {kind} --report` wrote"
        ) from None
    try:
        report = json.loads(raw, parse_constant=_refuse_constant)
    except ValueError as exc:
        raise TrainserveError(f"{kind} report {path} is not strict JSON ({_first_line(exc)})") from None
    problem = schema_problem(report, schema)
    if problem:
        raise TrainserveError(f"{kind} report {path} is not a valid trainserve {kind} report: {problem}")
    return ReadReport(Path(path), report, hashlib.sha256(raw).hexdigest())


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0]


@functools.cache
def _validator(schema: Path = SCHEMA_PATH):
    import jsonschema

    return jsonschema.Draft202012Validator(json.loads(schema.read_text()))


def schema_problem(report, schema: Path = SCHEMA_PATH) -> str | None:
    """The first way `report` breaks the schema (the eval report's by default), said in one line (None: it
    follows it)."""
    import jsonschema

    validator = _validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(report))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "the document"
    return f"at {where}: {_first_line(error)[:200]}"


def validate_report(report: dict, schema: Path = SCHEMA_PATH) -> None:
    """Raise jsonschema.ValidationError when a report does not follow its published schema."""
    _validator(schema).validate(report)


def strict_json(value):
    """`value` with every non-finite float as null: what JSON can carry (a NaN metric is "no value")."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(v) for v in value]
    return value


def dumps(report: dict) -> str:
    """The report as strict JSON text (allow_nan=False: a NaN that slipped through is a bug, not output)."""
    return json.dumps(strict_json(report), indent=2, allow_nan=False) + "\n"
