"""The documentation: the site builds with --strict (a broken link, a missing page or a page left out of the nav
fails), its generated reference holds every command and flag (walked here from the parsers, independently of
the hook that writes the page), the README is a short front door, and nothing the long README said was lost."""

from __future__ import annotations

import argparse
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conftest import REPO

# The section headings of the 1,009-line README this site replaced (commit a6b07fd): each must still be a
# heading of some page. A shallow CI clone has no history to read them from, so they are listed here.
OLD_README_SECTIONS = [
    "trainserve",
    "What `make demo` does",
    "`trainserve train`",
    "What a published version holds",
    "The CPU gate, and atomic publishing",
    "Your own model",
    "Your own images",
    "`trainserve serve-local`",
    "Serving over TLS",
    "`trainserve eval`",
    "Load mode: `trainserve load`",
    "Containers: `make train-gpu`, `docker compose up serve-cpu`, `make eval`",
    "Stand-in base images (tests only)",
    "Deciding a rollout",
    "Rolling out a new version",
    "Deploying to a cluster",
    "Dependencies: one lock for every environment",
    "Layout",
    "Tests",
    "Benchmarks",
]


class Headings(HTMLParser):
    """The text of every h1-h3 of a page (permalink marks dropped) and the ids of its h2s in order."""

    def __init__(self):
        super().__init__()
        self.headings: list[str] = []
        self.h2_ids: list[str] = []
        self._open: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag in ("h1", "h2", "h3"):
            self._open = []
            if tag == "h2":
                self.h2_ids.append(dict(attrs).get("id", ""))
        elif tag == "a" and self._open is not None and ("class", "headerlink") in attrs:
            self._open.append("\0")  # the permalink's text follows: cut here

    def handle_data(self, data):
        if self._open is not None:
            self._open.append(data)

    def handle_endtag(self, tag):
        if tag in ("h1", "h2", "h3") and self._open is not None:
            self.headings.append("".join(self._open).split("\0")[0].strip())
            self._open = None


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built in this process as `make docs` builds it: --strict, so any warning is an error."""
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    site_dir = tmp_path_factory.mktemp("site")
    config = load_config(str(REPO / "mkdocs.yml"), strict=True, site_dir=str(site_dir))
    config.plugins.on_startup(command="build", dirty=False)
    try:
        build(config)  # raises mkdocs.exceptions.Abort on the first warning under strict
    finally:
        config.plugins.on_shutdown()
    return site_dir


def page_headings(path: Path) -> Headings:
    parser = Headings()
    parser.feed(path.read_text())
    return parser


@pytest.mark.integration
def test_every_old_readme_section_has_a_page(site):
    found = {heading for page in site.rglob("index.html") for heading in page_headings(page).headings}
    # Headings render their backticks as <code>: compare the text.
    missing = [section for section in OLD_README_SECTIONS if section.replace("`", "") not in found]
    assert not missing, f"README sections with no page in the site: {missing}"


def walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ("trainserve",)):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk(sub, (*path, name))


@pytest.mark.unit
def test_the_reference_lists_every_command_and_flag(site):
    from trainserve.cli import build_parser

    page = (site / "reference" / "cli" / "index.html").read_text()
    ids = page_headings(site / "reference" / "cli" / "index.html").h2_ids
    sections = dict(zip(ids, re.split(r"<h2 id=", page)[1:]))
    commands = list(walk(build_parser()))
    assert len(commands) >= 12  # train, verify, runs, tf-config, serve-local, eval, load, report merge, rollout
    for path, parser in commands:
        section = sections.get("-".join(path))
        assert section is not None, f"{' '.join(path)}: no section in the reference"
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name in action.choices:
                    assert f"<code>{name}</code>" in section, f"{' '.join(path)}: command {name} not listed"
                continue
            names = action.option_strings or [action.metavar or action.dest]
            for name in names:
                assert f"<code>{name}</code>" in section, f"{' '.join(path)}: {name} missing from the reference"
            meta = isinstance(action, argparse._HelpAction | argparse._VersionAction)
            if action.option_strings and not meta and action.help != argparse.SUPPRESS and len(path) > 1:
                assert f"<code>TRAINSERVE_{action.dest.upper()}</code>" in section


# Flags removed since they were released in a commit: each stays named in the changelog, with what replaced it.
REMOVED = (
    ("promote", "--force"),
    ("rollout", "--gate-max-latency-ratio"),
    ("rollout", "--gate-max-flip-rate"),
)


@pytest.mark.unit
@pytest.mark.parametrize(("command", "flag"), REMOVED)
def test_the_changelog_names_every_removed_flag(command, flag):
    from trainserve.cli import build_parser

    (parser,) = [p for path, p in walk(build_parser()) if path == ("trainserve", command)]
    assert flag not in {s for action in parser._actions for s in action.option_strings}, f"{flag} is back"
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert f"`trainserve {command} {flag}`" in changelog, (
        f"CHANGELOG.md does not say `trainserve {command} {flag}` went"
    )


SCHEMAS = sorted((REPO / "src" / "trainserve").rglob("*.schema.json"))


@pytest.mark.unit
def test_the_report_schemas_are_found():
    assert {path.name for path in SCHEMAS} >= {"eval_report.schema.json", "report.schema.json"}


@pytest.mark.unit
@pytest.mark.parametrize("schema", SCHEMAS, ids=[path.parent.name for path in SCHEMAS])
def test_the_reference_renders_the_report_schemas(site, schema):
    text = json.loads(schema.read_text())
    page = (site / "reference" / "schemas" / "index.html").read_text()
    assert text["$id"] in page
    for field in text["properties"]:
        assert f"<code>{field}</code>" in page, f"{schema}: {field} not rendered"
    for name, definition in text.get("$defs", {}).items():
        for field in definition.get("properties", {}):
            assert f"<code>{name}.{field}</code>" in page, f"{schema}: {name}.{field} not rendered"


@pytest.mark.unit
def test_the_readme_is_a_short_front_door():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    links = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert links, "the README links into the documentation"
    assert all((REPO / link).is_file() for link in links), [link for link in links if not (REPO / link).is_file()]


@pytest.mark.unit
def test_the_readme_test_command_is_what_ci_runs():
    ci = (REPO / ".ci" / "run").read_text()
    command = re.search(r"^(make test)\b", ci, re.MULTILINE)
    assert command, ".ci/run runs `make test`"
    assert f"{command.group(1)}   #" in (REPO / "README.md").read_text()
