"""The package mirrors the deployment: three stages in three images, none importing another."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "trainserve"
STAGES = ("training", "serving", "evaluation", "rollout")


def imported_modules(source: str) -> set[str]:
    """Every module a source file imports, at any depth (lazy imports inside functions included)."""
    modules = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    return modules


def cross_stage_imports(stage: str, source: str) -> list[str]:
    """Imports of another stage's package from a module of `stage`."""
    others = [s for s in STAGES if s != stage]
    return sorted(
        m
        for m in imported_modules(source)
        if any(m == f"trainserve.{o}" or m.startswith(f"trainserve.{o}.") for o in others)
    )


@pytest.mark.parametrize("stage", STAGES)
def test_no_stage_imports_another(stage):
    offenders = {
        str(path.relative_to(PACKAGE)): bad
        for path in sorted((PACKAGE / stage).rglob("*.py"))
        if (bad := cross_stage_imports(stage, path.read_text()))
    }
    assert not offenders, f"stage {stage!r} imports another stage (move shared code to trainserve/*.py): {offenders}"


@pytest.mark.parametrize(
    "source",
    [
        "from trainserve.training import run",
        "from trainserve.training.gate import run_gate",
        "import trainserve.training.export",
        "def f():\n    from trainserve.training.model import build_model\n",
        "from trainserve import training",
    ],
    ids=["package", "module", "plain-import", "lazy-import", "from-parent"],
)
def test_checker_catches_an_evaluation_module_importing_training(source):
    assert cross_stage_imports("evaluation", source), source


def test_checker_allows_shared_modules_and_the_own_stage():
    source = "from trainserve.layout import DEFAULT_SIGNATURE\nfrom trainserve.evaluation.client import Target\n"
    assert cross_stage_imports("evaluation", source) == []


def test_shared_modules_import_no_stage():
    shared = [p for p in PACKAGE.glob("*.py") if p.name not in ("cli.py", "__main__.py")]
    offenders = {
        p.name: bad
        for p in shared
        if (bad := sorted(m for m in imported_modules(p.read_text()) if m.split(".")[1:2] in ([s] for s in STAGES)))
    }
    assert not offenders, f"shared modules must not depend on a stage: {offenders}"


MAX_MODULE_LINES, MAX_FUNCTION_LINES = 350, 60


def test_modules_and_functions_stay_small():
    """A module does one job and a function fits on a screen; past that, split by responsibility."""
    too_long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        name = str(path.relative_to(PACKAGE))
        if source.count("\n") >= MAX_MODULE_LINES:
            too_long.append(f"{name}: {source.count(chr(10))} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{name}:{node.lineno} {node.name}(): {length} lines")
    assert not too_long, f"modules >= {MAX_MODULE_LINES} or functions > {MAX_FUNCTION_LINES} lines: {too_long}"
