"""docs/deciding-a-rollout.md shows no output the code would not print today: every block is rendered from the
recorded per-example answers of real trainings (scripts/deciding_a_rollout.py) and compared with the page."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("deciding_a_rollout", REPO / "scripts" / "deciding_a_rollout.py")
script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(script)


def test_every_output_on_the_page_is_what_the_code_prints():
    blocks = script.render()
    names = {"seed", "seed-wider", "lost3", "lost3-half", "planning", "slices", "gate-slices", "slice-gate", "table"}
    assert set(blocks) == names
    stale = script.differences(script.PAGE.read_text(), blocks)
    assert not stale, f"run `python scripts/deciding_a_rollout.py render --write`: {stale} differ"


def test_a_changed_number_is_caught_and_rewritten():
    page = script.PAGE.read_text()
    blocks = script.render()
    edited = page.replace(blocks["planning"], blocks["planning"].replace("examples", "exemples", 1))
    assert script.differences(edited, blocks) == ["planning"]
    assert script.rewritten(edited, blocks) == page
    assert script.differences(page.replace("<!-- output: slices -->", "<!-- output: gone -->"), blocks) == [
        "slices",
        "gone",
    ]
