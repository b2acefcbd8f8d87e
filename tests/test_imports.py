"""The package's layers are its folders, and imports only go down them.

=========  =====================================================================================
rung       folders (each imports only its own folder, lower rungs and the leaves)
=========  =====================================================================================
0          ``compat``: the private members of Celery, kombu and redis-py, checked
1          ``values``: values and pure functions, no I/O
2          ``store``: the only code that talks to Redis
3          ``recovery``: records written back after the dedup Redis lost its data
4          ``brokers``: what differs from one kind of broker to another
5          ``runs``: a run's lease, the app's runtime
6          ``producer`` | ``worker``: side by side, neither imports the other
top        the modules users import (and ``beat/``, ``demo/``, ``webview/``): anything below
=========  =====================================================================================

A top-level module that imports nothing of the package is a leaf (``errors``, ``events``):
every layer may import it. Nothing is listed by hand but the order of the rungs: a module
belongs to the layer of the folder it is in.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "dedupe"

#: The internal folders, lowest first; folders on one rung never import each other.
RUNGS: tuple[tuple[str, ...], ...] = (
    ("compat",),
    ("values",),
    ("store",),
    ("recovery",),
    ("brokers",),
    ("runs",),
    ("producer", "worker"),
)
#: The most modules a folder (or the package's top) may hold.
MOST_MODULES = 16


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}
FOLDERS = {folder for rung in RUNGS for folder in rung}


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
# A folder's own __init__ is imported by every import of a module in it: not an edge.
for _module, _imported in GRAPH.items():
    _imported -= {f"dedupe.{folder}" for folder in FOLDERS}


def folder_of(module: str) -> str | None:
    """The internal folder a module is in, or None for the top (and ``beat``, ``demo``,
    ``webview``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in FOLDERS else None


def is_leaf(module: str) -> bool:
    """A top-level module that imports nothing of the package."""
    return folder_of(module) is None and module.count(".") == 1 and not GRAPH[module]


def rung_of(module: str) -> int:
    folder = folder_of(module)
    return next(i for i, rung in enumerate(RUNGS) if folder in rung)


def upward_imports(module: str) -> set[str]:
    """What ``module`` imports that its layer may not: a higher rung, a sibling folder on its
    own rung, or an entry module."""
    folder = folder_of(module)
    if folder is None:
        return set()
    mine = rung_of(module)
    return {
        imported
        for imported in GRAPH[module]
        if not is_leaf(imported)
        and folder_of(imported) != folder
        and (folder_of(imported) is None or rung_of(imported) >= mine)
    }


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
    GRAPH["dedupe.values.keys"].add("dedupe.worker.run_start")
    try:
        assert _cycle() is not None
    finally:
        GRAPH["dedupe.values.keys"].discard("dedupe.worker.run_start")


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


@pytest.mark.parametrize("module", sorted(m for m in MODULES if folder_of(m)))
def test_a_layer_imports_only_its_own_folder_lower_rungs_and_leaves(module: str) -> None:
    assert upward_imports(module) == set()


@pytest.mark.parametrize(
    ("module", "imported"),
    [
        ("dedupe.values.keys", "dedupe.store.store"),  # a rung up
        ("dedupe.producer.guard", "dedupe.worker.run_start"),  # the other side
        ("dedupe.worker.run_start", "dedupe.producer.guard"),
        ("dedupe.runs.runtime", "dedupe.task"),  # an entry point
    ],
)
def test_the_layer_check_finds_an_upward_import(module: str, imported: str) -> None:
    GRAPH[module].add(imported)
    try:
        assert upward_imports(module) == {imported}
    finally:
        GRAPH[module].discard(imported)


def test_the_leaves_are_the_error_tree_and_the_signals() -> None:
    assert {module for module in MODULES if is_leaf(module)} >= {"dedupe.errors", "dedupe.events"}


def test_every_folder_of_the_package_is_a_rung_or_an_entry_package() -> None:
    folders = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert folders - FOLDERS == {"beat", "demo", "webview"}


@pytest.mark.parametrize("folder", ["", *sorted(FOLDERS), "beat", "demo", "webview"])
def test_no_folder_holds_more_than_sixteen_modules(folder: str) -> None:
    here = PACKAGE / folder
    modules = [
        path for path in here.glob("*.py") if path.name not in {"__init__.py", "__main__.py"}
    ]
    assert len(modules) <= MOST_MODULES
