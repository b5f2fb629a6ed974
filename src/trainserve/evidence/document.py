"""An eval report as a document: read once, strict JSON, checked against its published schema.

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


@dataclass(frozen=True)
class ReadReport:
    """A report as judged: the parsed document and the SHA-256 of exactly the bytes parsed."""

    path: Path
    report: dict
    sha256: str


def read_report(path: Path) -> ReadReport:
    """The report at `path`, strict JSON, valid against the schema; else one line naming what is wrong."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise TrainserveError(
            f"eval report {path} cannot be read ({exc.strerror}): expected an eval --report"
        ) from None
    try:
        report = json.loads(raw, parse_constant=_refuse_constant)
    except ValueError as exc:
        raise TrainserveError(f"eval report {path} is not strict JSON ({_first_line(exc)})") from None
    problem = schema_problem(report)
    if problem:
        raise TrainserveError(f"eval report {path} is not a valid trainserve eval report: {problem}")
    return ReadReport(Path(path), report, hashlib.sha256(raw).hexdigest())


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0]


@functools.cache
def _validator():
    import jsonschema

    return jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))


def schema_problem(report) -> str | None:
    """The first way `report` breaks the schema, said in one line (None: it follows it)."""
    import jsonschema

    validator = _validator()
    error = jsonschema.exceptions.best_match(validator.iter_errors(report))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "the document"
    return f"at {where}: {_first_line(error)[:200]}"


def validate_report(report: dict) -> None:
    """Raise jsonschema.ValidationError when a report does not follow the published schema."""
    _validator().validate(report)


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
