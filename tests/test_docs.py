"""The docs' code is code that runs.

- A ```python block headed ``# examples/<path>`` must appear, verbatim, in that example file
  (as the README's, tests/test_readme.py).
- A block right after a ``<!-- not run -->`` line is illustrative only (it points at your
  Redis, your scheduler, your settings) and is not run.
- Every other ```python block runs. The blocks of one page run in order, in one namespace that
  starts with ``app``: an installed Celery app on the test session's Redis (broker and dedup
  store), with a key prefix and a queue of its own, whose ``app.task`` makes tasks of this app
  alone (``shared=False``: the next test's app would otherwise inherit them). Each block is a
  test of its own, which first runs the page's earlier blocks on a fresh app.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from celery import Celery

from .helpers import ROOT

DOCS = ROOT / "docs"
NOT_RUN = "<!-- not run -->"
BLOCK = re.compile(r"^```python\n(.*?)^```", flags=re.MULTILINE | re.DOTALL)
EXAMPLE = re.compile(r"# (examples/\S+)\n")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    code: str
    marked_not_run: bool

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(DOCS)}:{self.line}"

    @property
    def example(self) -> str | None:
        found = EXAMPLE.match(self.code)
        return found.group(1) if found else None


def _blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    blocks = []
    for found in BLOCK.finditer(text):
        before = text[: found.start()].rstrip("\n").rsplit("\n", 1)[-1]
        line = text.count("\n", 0, found.start()) + 1
        blocks.append(Block(page, line, found.group(1), before.strip() == NOT_RUN))
    return blocks


PAGES = sorted(DOCS.rglob("*.md"))
BLOCKS = [block for page in PAGES for block in _blocks(page)]
EXAMPLES = [block for block in BLOCKS if block.example is not None]
RUNNABLE = [block for block in BLOCKS if block.example is None and not block.marked_not_run]


def test_the_docs_show_the_examples_and_run_blocks() -> None:
    assert {block.example for block in EXAMPLES} >= {
        "examples/fastapi_app/main.py",
        "examples/django_site/reports/views.py",
    }
    # A handful, on the pages users copy from first.
    pages = {block.page.name for block in RUNNABLE}
    assert {"index.md", "testing.md", "troubleshooting.md"} <= pages, pages


@pytest.mark.parametrize("block", EXAMPLES, ids=[block.name for block in EXAMPLES])
def test_a_docs_snippet_is_the_examples_code(block: Block) -> None:
    assert block.example is not None
    snippet = block.code.split("\n", 1)[1]
    assert snippet.strip() in (ROOT / block.example).read_text(encoding="utf-8")


@pytest.mark.parametrize("block", RUNNABLE, ids=[block.name for block in RUNNABLE])
def test_a_docs_block_runs(block: Block, make_app: Callable[..., Celery]) -> None:
    app = make_app()
    app.task = functools.partial(app.task, shared=False)  # type: ignore[method-assign]
    namespace = {"__name__": f"docs_{block.page.stem.replace('-', '_')}", "app": app}
    earlier = [other for other in RUNNABLE if other.page == block.page and other.line < block.line]
    for other in [*earlier, block]:
        code = compile(other.code, f"{other.page}:{other.line}", "exec")
        exec(code, namespace)
