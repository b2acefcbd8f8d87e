"""Every command line the docs show names what exists: a ``celery -A proj dedupe`` line a
subcommand of the CLI and only options it takes; a ``./noxw -s NAME`` line a nox session.
(The shell blocks do not run: they need long-running processes and a project.)"""

from __future__ import annotations

import re
import shlex

import click
import pytest

from dedupe.cli import dedupe as dedupe_cli

from .helpers import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

# `celery -A proj dedupe ...` (or `celery dedupe ...`) as code: in a block or in backticks.
_CLI = re.compile(r"celery(?: -A \S+)? dedupe ([^`#\n]*)")
_NOX = re.compile(r"\./noxw -s ([\w-]+)")


def _lines(pattern: re.Pattern[str]) -> list[tuple[str, str]]:
    return [
        (f"{page.relative_to(ROOT)}:{number}", match.group(1))
        for page in PAGES
        for number, line in enumerate(page.read_text().splitlines(), 1)
        for match in pattern.finditer(line)
    ]


CLI_LINES = _lines(_CLI)


def _options(command: click.Command) -> set[str]:
    return {name for param in command.params for name in getattr(param, "opts", [])} | {"--help"}


@pytest.mark.parametrize(("where", "line"), CLI_LINES, ids=[where for where, _ in CLI_LINES])
def test_a_dedupe_command_line_in_the_docs_names_a_command_and_its_options(
    where: str, line: str
) -> None:
    # A line may show alternatives (`reap | purge`) and optional parts (`[--task NAME]`).
    for alternative in line.replace("[", " ").replace("]", " ").split("|"):
        words = shlex.split(alternative.strip().rstrip("."))
        if not words:
            continue
        assert isinstance(dedupe_cli, click.Group)
        command = dedupe_cli.commands.get(words[0])
        assert command is not None, f"{where}: no command {words[0]!r} in `celery dedupe`"
        options = {word.split("=")[0] for word in words[1:] if word.startswith("-")}
        unknown = options - _options(command)
        assert not unknown, f"{where}: `celery dedupe {words[0]}` takes no {sorted(unknown)}"


def test_every_nox_session_the_docs_name_exists() -> None:
    noxfile = (ROOT / "noxfile.py").read_text()
    sessions = set(re.findall(r"@nox\.session\([^)]*name=\"([\w-]+)\"", noxfile)) | set(
        re.findall(r"@nox\.session[^\n]*\n(?:@[^\n]*\n)*def ([\w]+)\(", noxfile)
    )
    sessions |= {name.replace("_", "-") for name in sessions}
    named = _lines(_NOX)
    assert named
    missing = [f"{where}: {name}" for where, name in named if name not in sessions]
    assert missing == []


def test_the_command_lines_are_found() -> None:
    # (A pattern that matched nothing would leave the checks above with nothing to check.)
    assert len(CLI_LINES) > 10
