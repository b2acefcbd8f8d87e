"""The README's code is the code the tests run: snippets marked with an example's path must
appear, verbatim, in that file."""

from __future__ import annotations

import re

import pytest

from .helpers import ROOT

README = (ROOT / "README.md").read_text()
SNIPPETS = re.findall(r"```python\n# (examples/\S+)\n(.*?)```", README, flags=re.DOTALL)


def test_the_readme_shows_the_examples() -> None:
    assert {path for path, _ in SNIPPETS} >= {
        "examples/fastapi_app/main.py",
        "examples/django_site/reports/views.py",
    }


@pytest.mark.parametrize(("path", "snippet"), SNIPPETS, ids=[path for path, _ in SNIPPETS])
def test_a_readme_snippet_is_the_examples_code(path: str, snippet: str) -> None:
    assert snippet.strip() in (ROOT / path).read_text()


def test_the_readme_is_at_most_300_lines() -> None:
    # Short enough to read whole: what is longer goes to docs/.
    assert len(README.splitlines()) <= 300


def _quickstart_commands() -> list[str]:
    section = README.split("## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, flags=re.DOTALL)
    assert block is not None
    return [line.split("#", 1)[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_the_quickstart_is_two_commands_the_demo_and_the_tests() -> None:
    assert _quickstart_commands() == ["./noxw -s demo", "./noxw -s tests"]


def test_ci_runs_the_quickstarts_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert _quickstart_commands()[1] in ci
