"""The docs name every option and every setting there is, and no other: their tables, and the
docstrings that list the call options, are checked against the one list in
dedupe/values/catalog.py (which validation reads too)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import dedupe
from dedupe.task import DedupeTask
from dedupe.values.catalog import OPTIONS, SETTINGS
from dedupe.values.options import CALL_OPTIONS

from .helpers import ROOT

README = ROOT / "README.md"
GUIDE = ROOT / "docs" / "index.md"
SETTINGS_PAGE = ROOT / "docs" / "settings.md"

OPTION_NAMES = {option.name for option in OPTIONS}
SETTING_NAMES = {setting.name for setting in SETTINGS}


def _table(page: Path, header: str) -> set[str]:
    """The names (in backquotes) in the first column of the page's table headed ``header``."""
    lines = page.read_text(encoding="utf-8").splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith(f"| {header} | default |"))
    names: set[str] = set()
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        names.update(re.findall(r"`(\w+)`", line.split("|")[1]))
    return names


@pytest.mark.parametrize("page", [README, GUIDE], ids=["README.md", "docs/index.md"])
def test_the_options_table_names_every_option_and_no_other(page: Path) -> None:
    assert _table(page, "option") == OPTION_NAMES


def test_the_settings_page_names_every_setting_and_no_other() -> None:
    assert _table(SETTINGS_PAGE, "setting") == SETTING_NAMES


def test_the_readmes_settings_table_names_settings_there_are() -> None:
    # (A selection: the settings page has them all.)
    assert _table(README, "setting") - SETTING_NAMES == set()


def test_dedupe_apply_async_names_every_call_option() -> None:
    doc = dedupe.apply_async.__doc__ or ""
    assert [name for name in CALL_OPTIONS if f"``{name}``" not in doc] == []


def _docstrings() -> list[tuple[str, str]]:
    found = []
    for path in sorted((ROOT / "dedupe").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                doc = ast.get_docstring(node)
                if doc:
                    found.append((f"{path.relative_to(ROOT)}:{node.name}", doc))
    return found


def test_a_docstring_that_lists_call_options_lists_them_all() -> None:
    # Three names or more make a list (apply_async's, delay_unique's); fewer, a mention.
    partial = {}
    for where, doc in _docstrings():
        named = {name for name in CALL_OPTIONS if f"``{name}``" in doc}
        if len(named) >= 3 and named != set(CALL_OPTIONS):
            partial[where] = sorted(set(CALL_OPTIONS) - named)
    assert partial == {}


def test_dedupe_task_declares_every_task_option() -> None:
    assert OPTION_NAMES - set(DedupeTask.__annotations__) == set()


def test_the_settings_read_are_the_settings_listed() -> None:
    source = (ROOT / "dedupe" / "values" / "config.py").read_text(encoding="utf-8")
    assert set(re.findall(r'_setting\(\s*conf,\s*"(dedupe_\w+)"', source)) == SETTING_NAMES
