"""Options declared once: a config dataclass field carries its type, default and help text, and the
command line is derived from it (flag `--field-name`, env `TRAINSERVE_FIELD_NAME`, choices from a
`Literal`). A nested dataclass field becomes a group of prefixed flags (`synthetic.size` ->
`--synthetic-size`). `EnvDefaults` is the parser every command uses: one-line errors, defaults from the
environment."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

T = TypeVar("T")


def option(
    default: Any = None,
    help: str = "",
    *,
    parse=None,
    flag: str | None = None,
    factory=None,
    metavar: str | None = None,
    env: bool = True,
    repeat: bool = False,
) -> Any:
    """A config field that is also a flag. `parse` converts the flag's text (default: from the type); `metavar`
    names its value in --help (default: the flag's name in capitals); `env=False`: a flag only, never read from
    the environment (an override must be typed where it is meant, not inherited from a shell); `repeat=True`: the
    flag may be given again, each value parsed and kept in order (a tuple; a flag only)."""
    metadata = {"help": help, "parse": parse, "flag": flag, "metavar": metavar, "env": env and not repeat}
    metadata["repeat"] = repeat
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: expected an integer >= 1")
    return value


def share(text: str) -> float:
    """A share, rate or fraction: a number in [0, 1]."""
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a share between 0 and 1")
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


def parse_bool(text: str) -> bool:
    """`true/false` as tensorflow_model_server's flags take them (also 1/0, yes/no, on/off)."""
    if text.lower() in ("true", "1", "yes", "on"):
        return True
    if text.lower() in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r}: expected true or false (or 1/0, yes/no, on/off)")


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


def add_options(parser: argparse.ArgumentParser, cls, prefix: str = "", *, word_separator: str = "-") -> None:
    """One flag per field of the dataclass `cls` (recursing into nested dataclasses).

    `word_separator="_"` keeps a field's name as its flag (`--model_base_path`, as tensorflow_model_server
    spells its flags). A bool field is a switch (`--flag`), or with `parse=` a value (`--flag=false`).
    """
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind = _unwrap_optional(hints[f.name])
        dest = f"{prefix}{f.name}"
        if _is_group(kind, f):
            add_options(parser, kind, prefix=f"{dest}_", word_separator=word_separator)
            continue
        flag = f.metadata.get("flag") or "--" + dest.replace("_", word_separator)
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        kwargs: dict[str, Any] = {"dest": dest, "default": default, "help": f.metadata.get("help", "")}
        if f.metadata.get("metavar"):
            kwargs["metavar"] = f.metadata["metavar"]
        if kind is bool and f.metadata.get("parse"):
            kwargs.update(type=f.metadata["parse"], nargs="?", const=True, metavar="BOOL")
        elif kind is bool:
            kwargs["action"] = "store_true"
        elif typing.get_origin(kind) is Literal:
            kwargs["choices"] = choices_of(kind)
        else:
            kwargs["type"] = f.metadata.get("parse") or (kind if kind in (int, float, Path) else str)
        if f.metadata.get("repeat"):  # argparse appends to a list of its own; the field's default stays put
            kwargs.update(action="append", default=None)
        action = parser.add_argument(flag, **kwargs)
        action.from_env = f.metadata.get("env", True)


def config_from_args(cls, args: argparse.Namespace, prefix: str = ""):
    """The dataclass `cls` built from parsed flags (the inverse of `add_options`)."""
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        kind = _unwrap_optional(hints[f.name])
        dest = f"{prefix}{f.name}"
        values[f.name] = config_from_args(kind, args, f"{dest}_") if _is_group(kind, f) else getattr(args, dest)
        if f.metadata.get("repeat"):
            given = values[f.name]
            values[f.name] = tuple(given) if given is not None else tuple(f.default)
    return cls(**values)


class EnvDefaults(argparse.ArgumentParser):
    """An ArgumentParser whose defaults come from TRAINSERVE_* environment variables when set.

    The variables are read when this parser parses, so only the invoked command's flags consult
    them: TRAINSERVE_MODEL means eval's --model to `trainserve eval` and does not trouble `train`.
    """

    def error(self, message: str):
        """One line, naming the problem (argparse's default adds the whole usage block)."""
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")

    def add_argument(self, *names, **kwargs):
        action = super().add_argument(*names, **kwargs)
        if action.help and action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
            action.help += " (default: %(default)s)"
        return action

    def parse_known_args(self, args=None, namespace=None):
        for action in self._actions:
            env = f"TRAINSERVE_{action.dest.upper()}"
            if not action.option_strings or env not in os.environ or not getattr(action, "from_env", True):
                continue
            raw = os.environ[env]
            # A switch's variable is read as a bool, strictly: a typo must not quietly turn it off.
            parse = parse_bool if isinstance(action, argparse._StoreTrueAction) else action.type
            try:
                action.default = parse(raw) if parse else raw
            except (ValueError, argparse.ArgumentTypeError) as exc:
                self.error(f"environment variable {env}={raw!r}: {exc}")
            if action.choices and action.default not in action.choices:
                self.error(f"environment variable {env}={raw!r}: expected one of {', '.join(action.choices)}")
        return super().parse_known_args(args, namespace)


class DeprecatedAlias(argparse.Action):
    """An old flag name that still works for one release, with a warning naming the new one."""

    def __init__(self, *args, new_flag: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.new_flag = new_flag

    def __call__(self, parser, namespace, values, option_string=None):
        print(
            f"{parser.prog}: warning: {option_string} is deprecated and will be removed in the next release: "
            f"use {self.new_flag}",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, values)
