"""The package's imports form a ladder: each module imports only modules below it, with no
cycle, and none hides an import of the package inside a function to break one.

=========  ====================================================================================
layer      modules
=========  ====================================================================================
base       errors, defaults, _generics, canonical, timing, config, options, keys, record, call,
           header, events, clients, script_runner, cluster_runner, store, async_store,
           publish_seam, heartbeat, runtime, run, liveness, result, inventory, checks,
           _redis_server
producer   producer, aio, send_many, bulk (never the worker side)
worker     worker, prefork_parent (never the producer side)
entry      task, installer, web, cli, django, demo, prometheus, beat, and the package itself
=========  ====================================================================================
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "dedupe"

PRODUCER = {"dedupe.producer", "dedupe.aio", "dedupe.send_many", "dedupe.bulk"}
WORKER = {"dedupe.worker", "dedupe.prefork_parent"}
ENTRY = {
    "dedupe",
    "dedupe.task",
    "dedupe.installer",
    "dedupe.web",
    "dedupe.cli",
    "dedupe.django",
    "dedupe.demo",
    "dedupe.prometheus",
    "dedupe.beat",
    "dedupe.beat.database",
    "dedupe.beat.redbeat",
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}
BASE = set(MODULES) - PRODUCER - WORKER - ENTRY


def _resolve(module: str, path: Path, node: ast.ImportFrom | ast.Import) -> Iterator[str]:
    """The package's modules an import statement imports."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            package = module if path.name == "__init__.py" else module.rpartition(".")[0]
            for _ in range(node.level - 1):
                package = package.rpartition(".")[0]
            base = f"{package}.{node.module}" if node.module else package
        else:
            base = node.module or ""
        # `from . import worker` names a module; `from .store import Store` a name in one.
        names = [
            f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
            for alias in node.names
        ]
    for name in names:
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name and (name == "dedupe" or name.startswith("dedupe.")):
            yield name


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _top_level_imports(module: str, path: Path) -> set[str]:
    imported: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if _is_type_checking(node):
            continue  # types only: never imported at run time
        for inner in ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node]:
            if isinstance(inner, (ast.Import, ast.ImportFrom)):
                imported.update(_resolve(module, path, inner))
    imported.discard(module)
    return imported


GRAPH = {module: _top_level_imports(module, path) for module, path in MODULES.items()}


def _cycle() -> list[str] | None:
    done: set[str] = set()

    def visit(module: str, trail: list[str]) -> list[str] | None:
        if module in trail:
            return [*trail[trail.index(module) :], module]
        if module in done:
            return None
        for imported in sorted(GRAPH[module]):
            found = visit(imported, [*trail, module])
            if found:
                return found
        done.add(module)
        return None

    for module in sorted(GRAPH):
        found = visit(module, [])
        if found:
            return found
    return None


def test_the_package_has_no_import_cycle() -> None:
    assert _cycle() is None


def test_the_cycle_finder_finds_a_cycle() -> None:
    GRAPH["dedupe.keys"].add("dedupe.worker")
    try:
        assert _cycle() is not None
    finally:
        GRAPH["dedupe.keys"].discard("dedupe.worker")


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_function_imports_the_package(module: str) -> None:
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    hidden = [
        f"line {inner.lineno}: {ast.unparse(inner)}"
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        for inner in ast.walk(node)
        if isinstance(inner, (ast.Import, ast.ImportFrom))
        and list(_resolve(module, MODULES[module], inner))
    ]
    assert hidden == []


@pytest.mark.parametrize("module", sorted(BASE))
def test_a_base_module_imports_only_base_modules(module: str) -> None:
    assert GRAPH[module] - BASE == set()


@pytest.mark.parametrize("module", sorted(PRODUCER))
def test_the_producer_side_never_imports_the_worker_side(module: str) -> None:
    assert GRAPH[module] & (WORKER | ENTRY) == set()


@pytest.mark.parametrize("module", sorted(WORKER))
def test_the_worker_side_never_imports_the_producer_side(module: str) -> None:
    assert GRAPH[module] & (PRODUCER | ENTRY) == set()
