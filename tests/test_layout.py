"""Version directories as TF Serving recognises them: child directories named by an integer."""

from __future__ import annotations

import pytest

from trainserve.layout import STAGING_PREFIX, numeric_versions

pytestmark = pytest.mark.unit


def test_only_ascii_digit_directories_are_versions(tmp_path):
    for name in ("1", "007", "12", "²", "١٢", "3a", f"{STAGING_PREFIX}4", ".5", "-6"):
        (tmp_path / name).mkdir()
    (tmp_path / "8").write_text("a file, not a version")
    assert numeric_versions(tmp_path) == [1, 7, 12]
