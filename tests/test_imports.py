"""The package's layers, read from its imports: no module imports itself through others
(counting imports inside functions and those for the type checker alone), the domain packages
never import the Dagster wiring, the command line or the demo, and the plain packages never
import Dagster.

A function-level import defers a heavy dependency for the command line's start-up; it never
breaks a cycle, so the graph here counts it like any other.
"""

import ast
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import llm_assets
from tests.cli_zygote import IMPORTED_BY_THE_COMMAND

PACKAGE = Path(llm_assets.__file__).parent
TOP = ("defs", "cli", "demo", "definitions")
"""What only the entry points may import: the Dagster wiring, the command line, the demo and
the code location."""
DOMAIN = ("spec", "steps", "resources", "items", "results", "compliance", "evaluation", "util")
PLAIN = ("spec", "steps", "items", "results", "compliance", "evaluation", "util")
"""Packages with no Dagster import; spec/checks.py asks Dagster's own cron rule (below)."""
DAGSTER_ALLOWED = {("llm_assets.spec.checks", "dagster._utils.schedules")}


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The modules that `module` imports, at any depth of its code: the package's own, and
    the third-party ones by their dotted name."""
    found: set[str] = set()
    stack: list[ast.AST] = [ast.parse(path.read_text(encoding="utf-8"))]
    while stack:
        node = stack.pop()
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
    return {
        name
        for name in found
        if name != module and (name in known or not name.startswith("llm_assets"))
    }


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def _package(module: str) -> str:
    return module.split(".")[1] if module.count(".") else ""


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Groups of modules that import each other, directly or through others (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        for target in sorted(t for t in graph[name] if t in graph):
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


def test_the_package_has_no_import_cycle() -> None:
    assert _cycles(_graph()) == []


def _edges_from(packages: tuple[str, ...], to: Callable[[str], bool]) -> list[tuple[str, str]]:
    """Each (module, imported) where a module of `packages` imports a module `to` holds for."""
    return sorted(
        (module, imported)
        for module, imported_modules in _graph().items()
        if _package(module) in packages
        for imported in imported_modules
        if to(imported)
    )


def test_domain_packages_never_import_the_top() -> None:
    wrong = _edges_from(
        DOMAIN, lambda name: name.startswith("llm_assets.") and _package(name) in TOP
    )
    assert wrong == []


def test_plain_packages_do_not_import_dagster() -> None:
    wrong = _edges_from(PLAIN, lambda name: name.split(".")[0] == "dagster")
    assert [edge for edge in wrong if edge not in DAGSTER_ALLOWED] == []


READ_AT_IMPORT = {"environ", "getenv", "stdin", "stdout", "stderr", "argv", "cwd", "from_env"}
"""What a module reads of its process's environment, terminal, arguments or folder."""


def _read_at_import(path: Path) -> list[str]:
    """Where the module's code that runs when it is imported (not its functions' bodies, but
    their decorators and defaults, and class bodies) reads one of READ_AT_IMPORT."""
    found = []
    stack: list[ast.AST] = list(ast.parse(path.read_text(encoding="utf-8")).body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            stack.extend([*node.decorator_list, *node.args.defaults])
            stack.extend(d for d in node.args.kw_defaults if d is not None)
            continue
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Attribute) and node.attr in READ_AT_IMPORT:
            found.append(f"{path.name}:{node.lineno} .{node.attr}")
        elif isinstance(node, ast.Name) and node.id in READ_AT_IMPORT:  # from os import environ
            found.append(f"{path.name}:{node.lineno} {node.id}")
        stack.extend(ast.iter_child_nodes(node))
    return found


def test_the_library_reads_no_environment_or_terminal_when_imported() -> None:
    """The tests' command zygote imports the library before a command's environment and
    terminal are set (tests/cli_zygote.py): only what it leaves to the command may read them."""
    reads = {name: _read_at_import(path) for name, path in _modules().items()}
    library = {
        name: found
        for name, found in reads.items()
        if found and not name.startswith(IMPORTED_BY_THE_COMMAND)
    }
    assert library == {}
    # The scan finds such a read: the console takes the terminal's width when imported.
    assert any(".stdout" in read for read in reads["llm_assets.cli.console"])


def test_the_code_location_loads_from_its_documented_name() -> None:
    from llm_assets.definitions import defs

    assert defs.resolve_all_job_defs()


def _loaded_after(code: str) -> set[str]:
    """Top-level packages in sys.modules after running code in a fresh interpreter."""
    script = (
        f"{code}\nimport sys\nprint(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    return set(done.stdout.split())


def test_the_command_line_starts_without_dagster_pandas_or_sdks() -> None:
    """`--help` and argument errors answer at once: the commands import what they run."""
    loaded = _loaded_after("import llm_assets.cli.main")
    assert loaded.isdisjoint(
        {
            "dagster",
            "pandas",
            "pandera",
            "boto3",
            "openai",
            "anthropic",
            "google",
            "torch",
            "genai_prices",
        }
    )


def test_the_code_location_loads_without_pandas_or_pandera() -> None:
    """Every Dagster run worker and code server loads the code location; pandas and pandera
    (a third of a second) are imported by the first validation, not by the definitions."""
    loaded = _loaded_after("import llm_assets.definitions")
    assert "dagster" in loaded
    assert loaded.isdisjoint({"pandas", "pandera"})


def test_genai_prices_is_imported_only_for_a_model_the_price_table_has_no_entry_for() -> None:
    """Its data module is 1.6 MB of Python: a fifth of a second that a process pricing only
    the table's models never pays."""
    price = "from llm_assets.resources.pricing import load_price_table\nload_price_table()"
    assert "genai_prices" not in _loaded_after(f"{price}.get('local', 'all-MiniLM-L6-v2')")
    assert "genai_prices" in _loaded_after(f"{price}.get('openai', 'gpt-5-mini')")


def test_the_steps_package_loads_a_step_without_the_others() -> None:
    loaded = _loaded_after("from llm_assets.steps import decide, lifecycle, quota")
    assert loaded.isdisjoint({"pandas", "pandera", "boto3"})
    # A name of the package loads the module that defines it (the script fails otherwise).
    _loaded_after(
        "import sys\nfrom llm_assets import steps\nsteps.cost_report\n"
        "assert 'llm_assets.steps.reports' in sys.modules"
    )


def test_a_spec_check_loads_only_its_provider_adapter() -> None:
    loaded = _loaded_after(
        "import sys\n"
        "from llm_assets.resources.providers.registry import adapter_class\n"
        "adapter_class('openai')\n"
        "assert 'llm_assets.resources.providers.anthropic_batch' not in sys.modules\n"
        "assert 'llm_assets.resources.providers.bedrock' not in sys.modules"
    )
    assert "dagster" in loaded


def test_the_local_model_runs_without_torch() -> None:
    """The local provider's model is numpy over the packaged weights (local_minilm.py):
    torch and sentence-transformers take seconds to import in every run worker."""
    loaded = _loaded_after(
        "from llm_assets.resources.providers.local_engine import LocalEngine\n"
        "LocalEngine.shared().embed(['hello'])"
    )
    assert loaded.isdisjoint({"torch", "sentence_transformers", "transformers"})


def test_storage_on_a_local_folder_never_imports_boto3() -> None:
    """boto3 is a tenth of a second of every CLI command and run worker; only S3 needs it."""
    loaded = _loaded_after(
        "import tempfile\n"
        "from llm_assets.resources.storage import ArtifactStorage\n"
        "storage = ArtifactStorage(base_url=tempfile.mkdtemp())\n"
        "storage.write_bytes('a/b.json', b'{}')\n"
        "assert storage.read_bytes(storage.uri('a/b.json')) == b'{}'"
    )
    assert "boto3" not in loaded and "botocore" not in loaded
    s3 = "from llm_assets.resources.storage import ArtifactStorage\n"
    s3 += "ArtifactStorage(base_url='s3://bucket/prefix')._s3()"
    assert "boto3" in _loaded_after(s3)
