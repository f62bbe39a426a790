"""The package's modules import each other without cycles, counting imports inside functions.

A function-level import defers a heavy dependency for the command line's start-up; it never
breaks a cycle, so the graph here counts it like any other. Imports under `if TYPE_CHECKING:`
run only for a type checker and are left out. Nothing imports the CLI: it is the outermost
layer (cli -> runner -> factory -> steps -> resources).
"""

import ast
from pathlib import Path

import llm_assets

PACKAGE = Path(llm_assets.__file__).parent
ORCHESTRATION = (
    "cli",
    "console",
    "definitions",
    "demo",
    "demo_corpus",
    "demo_data",
    "checks",
    "notify",
    "parallel",
    "retention_jobs",
    "runner",
    "schedules",
    "sensors",
)
"""Modules that drive the steps (the CLI, the demo, Dagster sensors, schedules and checks)."""


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that `module` imports, at any depth of its code."""
    found: set[str] = set()
    stack: list[ast.AST] = [ast.parse(path.read_text(encoding="utf-8"))]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".")
                if path.name != "__init__.py":
                    package.pop()
                package = package[: len(package) - node.level + 1]
                base = ".".join([*package, base] if base else package)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in known else base)
        stack.extend(ast.iter_child_nodes(node))
    return {name for name in found if name in known and name != module}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Groups of modules that import each other, directly or through others (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        for target in sorted(graph[name]):
            if target not in index:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            group = []
            while (member := stack.pop()) != name:
                group.append(member)
            if group:
                groups.append(sorted([*group, name]))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return groups


def test_the_graph_counts_imports_inside_functions() -> None:
    graph = _graph()
    assert "llm_assets.demo.run" in graph["llm_assets.cli.main"]  # imported in the `demo` command
    assert "llm_assets.resources" in graph["llm_assets.cli.main"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_nothing_imports_the_cli() -> None:
    graph = _graph()
    assert sorted(name for name, targets in graph.items() if "llm_assets.cli.main" in targets) == []


def test_no_cycle_runs_through_the_orchestration_modules() -> None:
    names = {f"llm_assets.{name}" for name in ORCHESTRATION}
    assert names <= set(_graph())
    assert [group for group in _cycles(_graph()) if names & set(group)] == []


def test_the_package_has_no_import_cycle() -> None:
    assert _cycles(_graph()) == []
