"""The package's layers, read from its imports: no module imports itself through others, the
domain packages never import the Dagster wiring, the command line or the demo, and the steps
are plain Python."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "llm_assets"
TOP = ("defs", "cli", "demo", "definitions")
"""What only the top may import: the Dagster wiring, the command line, the demo, the code
location."""
DOMAIN = ("spec", "steps", "resources", "items", "results", "compliance", "evaluation", "util")
PLAIN = ("spec", "steps", "items", "results", "compliance", "evaluation", "util")
"""Packages with no Dagster import; spec/checks.py asks Dagster's own cron rule (below)."""
DAGSTER_ALLOWED = {("llm_assets.spec.checks", "dagster._utils.schedules")}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Every module a file imports, anywhere in it (lazy and TYPE_CHECKING imports too):
    `from package import module` names the module, not the package's face."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            found.update(name for name in names if name in modules)
            if any(name not in modules for name in names):
                found.add(node.module)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: _imports(path, set(paths)) for name, path in paths.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), the third-party
    modules left out."""
    inner = {m: {i for i in deps if i in graph} for m, deps in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in inner[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(inner):
        if module not in index:
            visit(module)
    return circles


def _package(module: str) -> str:
    return module.split(".")[1] if module.count(".") else ""


def test_no_import_circles(graph):
    assert _circles(graph) == []


def test_domain_packages_never_import_the_top(graph):
    wrong = sorted(
        (module, imported)
        for module, deps in graph.items()
        if _package(module) in DOMAIN
        for imported in deps
        if imported.startswith("llm_assets.") and _package(imported) in TOP
    )
    assert wrong == []


def test_plain_packages_do_not_import_dagster(graph):
    wrong = sorted(
        (module, imported)
        for module, deps in graph.items()
        if _package(module) in PLAIN
        for imported in deps
        if imported.split(".")[0] == "dagster" and (module, imported) not in DAGSTER_ALLOWED
    )
    assert wrong == []


def test_the_circle_finder_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_code_location_loads_from_its_documented_name():
    from llm_assets.definitions import defs

    assert defs.resolve_all_job_defs()
