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
