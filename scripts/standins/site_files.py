"""The files (relative to site-packages) of packages this environment has installed, for the stand-in images to
copy instead of downloading the same wheels again: every package a requirements export pins (or only the
dependency closure of --closure-of), each checked to be installed at exactly the pinned version.

    site_files.py requirements/serve.txt --closure-of tensorflow-cpu        # TensorFlow and what it needs
    site_files.py requirements/serve.txt --without-closure-of tensorflow-cpu  # the rest of serve-local's
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import re
import sys
from pathlib import Path

from packaging.requirements import Requirement

# The image's own venv brings its installer; pip installs over it in the images built FROM a stand-in.
KEPT_FROM_THE_IMAGE = {"pip", "setuptools"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    """name -> version of every requirement in an exported requirements file whose marker holds here."""
    pinned = {}
    for line in path.read_text().splitlines():
        if not line or line[0] in " #-":
            continue
        requirement = Requirement(line.rstrip(" \\"))
        if requirement.marker is None or requirement.marker.evaluate():
            pinned[canonical(requirement.name)] = str(requirement.specifier).removeprefix("==")
    return pinned


def closure(name: str) -> set[str]:
    """The installed distribution and everything it requires, transitively (no extras)."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        current = canonical(todo.pop())
        if current in seen:
            continue
        seen.add(current)
        for text in importlib.metadata.distribution(current).requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return seen


def compiled(file: importlib.metadata.PackagePath) -> str | None:
    """The byte code `make venv` compiled beside a module, so that a container's first import reads
    it instead of compiling in memory (the containers' user cannot write site-packages)."""
    if file.suffix != ".py":
        return None
    cached = Path(importlib.util.cache_from_source(str(file)))
    return str(cached) if (Path(file.locate()).parent / "__pycache__" / cached.name).is_file() else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("requirements", type=Path)
    parser.add_argument("--closure-of", help="only this package and its dependencies")
    parser.add_argument("--without-closure-of", help="leave out this package and its dependencies")
    args = parser.parse_args()
    pinned = pins(args.requirements)
    names = closure(args.closure_of) if args.closure_of else set(pinned)
    if args.without_closure_of:
        names -= closure(args.without_closure_of)
    for name in sorted(names - KEPT_FROM_THE_IMAGE):
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            sys.exit(f"site_files: {name} is not installed here: run `make venv`")
        if name not in pinned or dist.version != pinned[name]:
            sys.exit(f"site_files: {name} {dist.version} installed, {args.requirements} pins {pinned.get(name)}")
        listed = {str(file) for file in dist.files or [] if not str(file).startswith("..")}  # bin/ is outside
        listed |= {cached for file in dist.files or [] if (cached := compiled(file))}
        for path in sorted(listed):
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
