"""MkDocs hook: the reference pages generated at build time from where the code declares them, so they cannot
drift. `reference/cli.md` is written from the argparse parsers `trainserve` itself builds (`trainserve.cli`,
whose flags come from the `options.option()` fields of each stage's config), `reference/schemas.md` from every
`*.schema.json` file the package ships. Neither is a file in docs/: both exist only in the built site."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mkdocs.structure.files import File

REPO = Path(__file__).resolve().parents[2]


def on_files(files, config):
    """Add the generated pages beside the written ones (nav and link checks then see them as any other)."""
    files.append(File.generated(config, "reference/cli.md", content=cli_page()))
    files.append(File.generated(config, "reference/schemas.md", content=schemas_page()))
    return files


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ("trainserve",)):
    """(path, parser) for the program and every (sub)command, in the order `--help` lists them."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, (*path, name))


def cell(text: str) -> str:
    """Help text as a table cell: literal `<input>`, `*` and `|`, on one line (backticks stay code)."""
    for char, escaped in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ("*", "\\*"), ("|", "\\|"), ("\n", " ")):
        text = text.replace(char, escaped)
    return text


def flag_row(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    names = ", ".join(f"`{name}`" for name in action.option_strings) or f"`{action.metavar or action.dest}`"
    if action.help == argparse.SUPPRESS:
        new = getattr(action, "new_flag", None)
        text = f"deprecated: use `{new}`" if new else "hidden"
    else:
        text = (action.help or "") % {**vars(action), "prog": parser.prog}
    if action.choices and not isinstance(action, argparse._SubParsersAction):
        text += " One of: " + ", ".join(f"`{c}`" for c in action.choices) + "."
    if isinstance(action, argparse._StoreTrueAction):
        value = "(switch)"
    elif action.nargs == 0:
        value = ""
    else:
        value = f"`{action.metavar or action.dest.upper()}`"
        value += " ..." if action.nargs in ("+", "*") else ""
    plain = action.option_strings and not isinstance(action, argparse._HelpAction | argparse._VersionAction)
    env = f"`TRAINSERVE_{action.dest.upper()}`" if plain and parser.prog != "trainserve" else ""
    return f"| {names} | {value} | {env} | {cell(text)} |"


def command_section(path: tuple[str, ...], parser: argparse.ArgumentParser) -> list[str]:
    lines = [f"## `{' '.join(path)}`", ""]
    if parser.description:
        lines += [cell(parser.description), ""]
    actions = [a for a in parser._actions if not isinstance(a, argparse._SubParsersAction)]
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for sub in subs:
        helps = {choice.dest: choice.help for choice in sub._choices_actions}
        lines += ["| command | what it does |", "|---|---|"]
        lines += [f"| [`{name}`](#{anchor((*path, name))}) | {cell(helps.get(name) or '')} |" for name in sub.choices]
        lines.append("")
    lines += ["| flag | value | variable | meaning |", "|---|---|---|---|"]
    lines += [flag_row(parser, action) for action in actions]
    return [*lines, ""]


def anchor(path: tuple[str, ...]) -> str:
    """The id the page's table of contents gives the command's heading."""
    return "-".join(path)


def cli_page() -> str:
    sys.path.insert(0, str(REPO / "src"))  # the checkout being built, whatever is installed
    from trainserve.cli import build_parser

    lines = [
        "# Commands and flags",
        "",
        "Generated from the parsers `trainserve` builds (each stage's config fields, declared once with",
        "`options.option()`), when the site is built: this page cannot disagree with `--help`. Every flag of a",
        "command can also be set as the variable beside it; a flag on the command line wins.",
        "",
    ]
    for path, parser in commands(build_parser()):
        lines += command_section(path, parser)
    return "\n".join(lines)


def schema_rows(node: dict, path: str, required: bool, ids: str) -> list[str]:
    """One row per property, depth first; a `$ref` links to its definition, listed once below."""
    kind = node.get("type") or ("one of " + ", ".join(json.dumps(v) for v in node["enum"]) if "enum" in node else "")
    if isinstance(kind, list):
        kind = " or ".join(kind)
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        kind = f"[{name}](#{ids}-{name})"
    limits = [f"{key} {node[key]}" for key in ("minimum", "maximum", "exclusiveMinimum", "const") if key in node]
    text = cell(node.get("description", "")) + (f" ({', '.join(limits)})" if limits else "")
    rows = [f"| `{path}` | {kind} | {'yes' if required else ''} | {text} |"] if path else []
    for key, sub in node.get("properties", {}).items():
        rows += schema_rows(sub, f"{path}.{key}" if path else key, key in node.get("required", []), ids)
    items = node.get("items")
    if isinstance(items, dict) and (items.get("properties") or "$ref" in items):
        rows += schema_rows(items, f"{path}[]", True, ids)
    return rows


def schema_section(source: str) -> list[str]:
    schema = json.loads((REPO / source).read_text())
    header = ["| field | type | required | meaning |", "|---|---|---|---|"]
    title = schema.get("title", source)
    lines = [f"## {title}: `{schema['$id']}`", "", cell(schema.get("description", "")), "", f"Source: `{source}`.", ""]
    ids = schema["$id"].replace(".", "-").replace("/", "-")
    lines += [*header, *schema_rows(schema, "", True, ids), ""]
    for name, definition in schema.get("$defs", {}).items():
        lines += [f'<a id="{ids}-{name}"></a>', "", f"### {name}", "", *header]
        lines += [*schema_rows(definition, name, True, ids), ""]
    return lines


def schemas_page() -> str:
    lines = [
        "# Report schemas",
        "",
        "The JSON reports follow these JSON Schemas (draft 2020-12), rendered from the schema files when the",
        "site is built. Fields are only ever added, under a new schema id.",
        "",
    ]
    for path in sorted((REPO / "src").rglob("*.schema.json")):  # every schema the package ships
        lines += schema_section(str(path.relative_to(REPO)))
    return "\n".join(lines)
