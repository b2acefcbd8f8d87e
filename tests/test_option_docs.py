"""The docs name every option and every setting there is, and no other: the one table of
each (docs/options.md, docs/settings.md), and the docstrings that list the call options, are
checked against the one list in dedupe/values/catalog.py (which validation reads too). No
other page keeps a table of its own, to drift from it."""

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
OPTIONS_PAGE = ROOT / "docs" / "options.md"
SETTINGS_PAGE = ROOT / "docs" / "settings.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]

OPTION_NAMES = {option.name for option in OPTIONS}
SETTING_NAMES = {setting.name for setting in SETTINGS}


def _rows(page: Path, header: str) -> list[list[str]]:
    """The cells of each row of the page's table whose first column is headed ``header``."""
    lines = page.read_text(encoding="utf-8").splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith(f"| {header} |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def _table(page: Path, header: str) -> set[str]:
    """The names (in backquotes) in the first column of the page's table headed ``header``."""
    return {name for row in _rows(page, header) for name in re.findall(r"`(\w+)`", row[0])}


def _plain(cell: str) -> str:
    return cell.replace("`", "")


def test_the_options_page_has_a_row_per_option_in_the_catalogs_order() -> None:
    assert [_plain(row[0]) for row in _rows(OPTIONS_PAGE, "option")] == [
        option.name for option in OPTIONS
    ]


def test_the_options_page_says_where_each_option_may_be_given_as_the_catalog_does() -> None:
    where = {_plain(row[0]): row[1] for row in _rows(OPTIONS_PAGE, "option")}
    assert where == {option.name: option.where for option in OPTIONS}


def test_the_options_pages_defaults_are_the_catalogs() -> None:
    defaults = {_plain(row[0]): _plain(row[2]) for row in _rows(OPTIONS_PAGE, "option")}
    assert defaults == {option.name: option.default for option in OPTIONS}


@pytest.mark.parametrize(
    "page",
    [page for page in PAGES if page not in (OPTIONS_PAGE, SETTINGS_PAGE)],
    ids=lambda page: str(page.relative_to(ROOT)),
)
def test_no_other_page_keeps_a_table_of_options_or_settings(page: Path) -> None:
    headers = re.findall(r"^\| (option|setting) \|", page.read_text(encoding="utf-8"), re.M)
    assert headers == []


def test_the_readme_names_every_option_and_links_the_options_page() -> None:
    text = README.read_text(encoding="utf-8")
    assert "(docs/options.md)" in text
    assert {name for name in OPTION_NAMES if f"`{name}`" not in text} == set()


def test_the_guide_links_the_options_page() -> None:
    assert "(options.md)" in GUIDE.read_text(encoding="utf-8")


def test_the_settings_page_names_every_setting_and_no_other() -> None:
    assert _table(SETTINGS_PAGE, "setting") == SETTING_NAMES


def test_the_readme_names_only_settings_there_are_and_links_the_settings_page() -> None:
    # (A selection: the settings page has them all.)
    text = README.read_text(encoding="utf-8")
    assert "(docs/settings.md)" in text
    assert set(re.findall(r"`(dedupe_\w+)`", text)) - SETTING_NAMES == set()


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
