"""The package mirrors the deployment: stages in their images, none importing another; TF Serving's protocol
from one source (trainserve.protos, never the serving wheel); no import cycle between modules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "trainserve"
STAGES = ("training", "serving", "evaluation", "live", "replay", "drift", "rollout")


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


@pytest.mark.unit
@pytest.mark.parametrize("stage", STAGES)
def test_no_stage_imports_another(stage):
    offenders = {
        str(path.relative_to(PACKAGE)): bad
        for path in sorted((PACKAGE / stage).rglob("*.py"))
        if (bad := cross_stage_imports(stage, path.read_text()))
    }
    assert not offenders, f"stage {stage!r} imports another stage (move shared code to trainserve/*.py): {offenders}"


@pytest.mark.unit
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


@pytest.mark.unit
def test_checker_allows_shared_modules_and_the_own_stage():
    source = (
        "from trainserve.layout import DEFAULT_SIGNATURE\nfrom trainserve.client import Target\n"
        "from trainserve.evaluation.plan import Plan\n"
    )
    assert cross_stage_imports("evaluation", source) == []


def shared_packages() -> list[str]:
    """Packages below trainserve that no stage owns (trainserve.protos, trainserve.client): code the stages share."""
    return sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py") if p.parent.name not in STAGES)


def stage_imports(source: str) -> list[str]:
    """Imports of any stage's package."""
    return sorted(m for m in imported_modules(source) if m.split(".")[1:2] in ([s] for s in STAGES))


@pytest.mark.unit
def test_shared_modules_import_no_stage():
    shared = [p for p in PACKAGE.glob("*.py") if p.name not in ("cli.py", "__main__.py")]
    shared += [p for package in shared_packages() for p in sorted((PACKAGE / package).rglob("*.py"))]
    offenders = {str(p.relative_to(PACKAGE)): bad for p in shared if (bad := stage_imports(p.read_text()))}
    assert not offenders, f"shared modules must not depend on a stage: {offenders}"


@pytest.mark.unit
def test_the_shared_packages_are_found():
    assert {"client", "protos"} <= set(shared_packages()), shared_packages()


@pytest.mark.unit
@pytest.mark.parametrize(
    "source",
    [
        "from trainserve.evaluation.data import EvalData",
        "def f():\n    import trainserve.rollout.steps\n",
        "from trainserve import serving",
    ],
    ids=["from-import", "lazy-import", "from-parent"],
)
def test_checker_catches_a_shared_module_importing_a_stage(source):
    assert stage_imports(source), source


MAX_MODULE_LINES, MAX_FUNCTION_LINES = 350, 60


@pytest.mark.integration
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


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules() -> dict[str, str]:
    """trainserve's module names -> their source (generated protos included: they import each other too)."""
    return {module_name(path): path.read_text() for path in sorted(PACKAGE.rglob("*.py"))}


def import_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """Module -> the trainserve modules it imports, at any depth (lazy and TYPE_CHECKING imports count: a cycle
    hidden in a function is still two modules that cannot be understood, or moved, one without the other).
    `from pkg import name` is an edge to `pkg.name` when that is a module, else to `pkg`."""
    graph = {}
    for module, source in sources.items():
        targets = set()
        for name in imported_modules(source):
            while name and name not in sources:
                name = name.rpartition(".")[0]
            if name.startswith("trainserve") and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected group of two or more modules (Tarjan), as a sorted list."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles)


@pytest.mark.unit
def test_no_import_cycle_between_modules():
    cycles = import_cycles(import_graph(package_modules()))
    assert not cycles, f"modules that import each other, directly or in a loop (split out what they share): {cycles}"


@pytest.mark.unit
@pytest.mark.parametrize(
    "sources, cycle",
    [
        pytest.param(
            {"trainserve.a": "from trainserve import b", "trainserve.b": "import trainserve.a"},
            ["trainserve.a", "trainserve.b"],
            id="two-modules",
        ),
        pytest.param(
            {
                "trainserve.a": "from trainserve.b import f",
                "trainserve.b": "from trainserve.c import g",
                "trainserve.c": "def h():\n    from trainserve.a import x\n",
            },
            ["trainserve.a", "trainserve.b", "trainserve.c"],
            id="loop-of-three-lazy",
        ),
        pytest.param(
            {
                "trainserve.p": "",
                "trainserve.p.a": "from trainserve.p.b import X",
                "trainserve.p.b": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                "    from trainserve.p import a\n",
            },
            ["trainserve.p.a", "trainserve.p.b"],
            id="type-checking",
        ),
    ],
)
def test_checker_catches_a_cycle(sources, cycle):
    assert import_cycles(import_graph(sources)) == [cycle]


@pytest.mark.unit
def test_checker_allows_a_chain_and_a_package_importing_its_parent():
    sources = {
        "trainserve": "",
        "trainserve.p": "",
        "trainserve.p.a": "from trainserve.p import b\nimport trainserve",
        "trainserve.p.b": "from trainserve import errors",
        "trainserve.errors": "",
    }
    assert import_cycles(import_graph(sources)) == []


SERVING_WHEEL = "tensorflow_serving"


def wheel_imports(source: str) -> list[str]:
    return sorted(m for m in imported_modules(source) if m == SERVING_WHEEL or m.startswith(SERVING_WHEEL + "."))


@pytest.mark.unit
def test_no_module_imports_the_serving_wheel():
    """tensorflow_serving.apis imports all of TensorFlow: trainserve.protos is the one source of its messages."""
    offenders = sorted(m for m, source in package_modules().items() if wheel_imports(source))
    assert not offenders, f"import trainserve.protos instead: {offenders}"


@pytest.mark.unit
@pytest.mark.parametrize(
    "source",
    [
        "from tensorflow_serving.apis import predict_pb2",
        "import tensorflow_serving.config.model_server_config_pb2",
        "def f():\n    from tensorflow_serving import apis\n",
    ],
    ids=["from-import", "plain-import", "lazy-import"],
)
def test_checker_catches_a_wheel_import(source):
    assert wheel_imports(source)
