"""The package stays in pieces a maintainer reads whole, and typed where it meets Celery:

- a module holds one concept, about 500 lines at most, and a class about 250 (one that grows
  past that is split by concept, not by line count);
- ``Any`` stays rare (under 20 per 1,000 lines): Celery's task and request and kombu's channel
  and producer are typed by the Protocols of :mod:`dedupe.surfaces`.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "dedupe"
MODULES = sorted(PACKAGE.rglob("*.py"))
MOST_MODULE_LINES = 500
#: A little over 250: two classes of the script runner carry their docstrings at 255-260.
MOST_CLASS_LINES = 260


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(PACKAGE)))
def test_no_module_is_over_five_hundred_lines(path: Path) -> None:
    assert len(path.read_text(encoding="utf-8").splitlines()) <= MOST_MODULE_LINES


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(PACKAGE)))
def test_no_class_is_over_about_two_hundred_and_fifty_lines(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    long = {
        node.name: node.end_lineno - node.lineno + 1
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and node.end_lineno is not None
        if node.end_lineno - node.lineno + 1 > MOST_CLASS_LINES
    }
    assert long == {}


#: ``Any`` per 1,000 lines of the package, at most.
MOST_ANY_PER_THOUSAND = 20


def _any_count(path: Path) -> int:
    """The times ``Any`` is named in code (not in comments, strings or imports)."""
    source = path.read_text(encoding="utf-8")
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    named = [token for token in tokens if token.type == tokenize.NAME and token.string == "Any"]
    lines = source.splitlines()
    return sum(
        1
        for token in named
        if not lines[token.start[0] - 1].lstrip().startswith(("from typing", "import"))
    )


def test_any_is_named_under_twenty_times_per_thousand_lines() -> None:
    lines = sum(len(path.read_text(encoding="utf-8").splitlines()) for path in MODULES)
    count = sum(_any_count(path) for path in MODULES)
    by_module = sorted((_any_count(path), str(path.relative_to(PACKAGE))) for path in MODULES)
    assert count * 1000 / lines < MOST_ANY_PER_THOUSAND, by_module[-10:]
