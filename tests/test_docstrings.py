"""A docstring says what a module, class or function is for, in fifteen lines at most; the
reasoning behind the internals is in docs/design-notes.md, and every module it names exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from .helpers import ROOT

PACKAGE = ROOT / "dedupe"
MOST_LINES = 15
SOURCES = sorted(PACKAGE.rglob("*.py"))


def _docstrings(path: Path) -> list[tuple[str, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = [("module", ast.get_docstring(tree, clean=False))]
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.append((node.name, ast.get_docstring(node, clean=False)))
    return [(name, text) for name, text in found if text]


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(ROOT)) for p in SOURCES])
def test_every_docstring_is_fifteen_lines_at_most(path: Path) -> None:
    long = {name: text.count("\n") + 1 for name, text in _docstrings(path)}
    assert {name: lines for name, lines in long.items() if lines > MOST_LINES} == {}


def test_every_design_note_is_about_a_module_that_exists() -> None:
    notes = (ROOT / "docs" / "design-notes.md").read_text(encoding="utf-8")
    named = re.findall(r"^## (dedupe\.\S+)$", notes, flags=re.MULTILINE)
    modules = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for p in SOURCES
    }
    assert named
    assert set(named) - modules == set()


def test_every_pointer_to_a_design_note_finds_it() -> None:
    notes = (ROOT / "docs" / "design-notes.md").read_text(encoding="utf-8")
    pointers = {
        name
        for path in SOURCES
        for name in re.findall(r'docs/design-notes\.md, "(dedupe[\w.]*)"', path.read_text())
    }
    assert pointers
    assert {name for name in pointers if f"\n## {name}\n" not in notes} == set()
