"""Options declared once: a config dataclass field carries its type, default and help text, and the
command line is derived from it (flag `--field-name`, env `TRAINSERVE_FIELD_NAME`, choices from a
`Literal`). A nested dataclass field becomes a group of prefixed flags (`synthetic.size` ->
`--synthetic-size`)."""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

T = TypeVar("T")


def option(default: Any = None, help: str = "", *, parse=None, flag: str | None = None, factory=None) -> Any:
    """A config field that is also a flag. `parse` converts the flag's text (default: from the type)."""
    metadata = {"help": help, "parse": parse, "flag": flag}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: expected an integer >= 1")
    return value


def key_values(text: str, convert: Callable[[str], T], expected: str) -> dict[str, T]:
    """`a=1,b=2` -> {"a": convert("1"), "b": convert("2")}; a malformed item names what was `expected`."""
    pairs = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = (side.strip() for side in item.partition("="))
        try:
            if not (sep and key and value):
                raise ValueError(item)
            pairs[key] = convert(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r}: expected {expected}") from None
    return pairs


def number_list(text: str, convert: Callable[[str], T], valid: Callable[[T], bool], expected: str) -> tuple[T, ...]:
    """`1,2,4` -> (1, 2, 4) when every value is `valid`; else an error naming what was `expected`."""
    try:
        values = tuple(convert(part) for part in text.split(",") if part.strip())
    except ValueError:
        values = ()
    if not values or not all(valid(v) for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: expected {expected}")
    return values


def image_shape(text: str) -> tuple[int, int, int]:
    try:
        dims = tuple(int(d) for d in text.lower().replace("x", ",").split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected H,W,C such as 28,28,1") from None
    if len(dims) != 3 or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected H,W,C such as 28,28,1")
    return dims  # type: ignore[return-value]


def choices_of(kind) -> tuple[str, ...]:
    """The values of a `Literal[...]` type (so a choice list is written once, in the type)."""
    return typing.get_args(kind)


def _unwrap_optional(kind):
    """`X | None` -> X."""
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        return args[0] if len(args) == 1 else kind
    return kind


def _is_group(kind, f: dataclasses.Field) -> bool:
    """A nested dataclass is a group of flags, unless the field parses its own text (`parse=`)."""
    return dataclasses.is_dataclass(kind) and not f.metadata.get("parse")


def add_options(parser: argparse.ArgumentParser, cls, prefix: str = "") -> None:
    """One flag per field of the dataclass `cls` (recursing into nested dataclasses)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind = _unwrap_optional(hints[f.name])
        dest = f"{prefix}{f.name}"
        if _is_group(kind, f):
            add_options(parser, kind, prefix=f"{dest}_")
            continue
        flag = f.metadata.get("flag") or "--" + dest.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        kwargs: dict[str, Any] = {"dest": dest, "default": default, "help": f.metadata.get("help", "")}
        if kind is bool:
            kwargs["action"] = "store_true"
        elif typing.get_origin(kind) is Literal:
            kwargs["choices"] = choices_of(kind)
        else:
            kwargs["type"] = f.metadata.get("parse") or (kind if kind in (int, float, Path) else str)
        parser.add_argument(flag, **kwargs)


def config_from_args(cls, args: argparse.Namespace, prefix: str = ""):
    """The dataclass `cls` built from parsed flags (the inverse of `add_options`)."""
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        kind = _unwrap_optional(hints[f.name])
        dest = f"{prefix}{f.name}"
        values[f.name] = config_from_args(kind, args, f"{dest}_") if _is_group(kind, f) else getattr(args, dest)
    return cls(**values)
