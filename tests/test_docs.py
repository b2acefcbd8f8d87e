"""The code of the README and the docs is code that runs.

- A ```python block headed ``# examples/<path>`` must appear, verbatim, in that example file
  (as the README's, tests/test_readme.py); the tests run those files as real servers.
- An HTML comment on the line right before a block may say how it runs:
  ``<!-- not run: why -->``: it is not run, for the reason given (a server this machine has
  not, a fixed port); ``<!-- with: code -->``: that code runs first, hidden (what a
  placeholder stands for); ``<!-- with a worker -->``: it runs while Celery's in-process test
  worker (solo pool) consumes the app's queue.
- Every other ```python block runs, those of one page in order, in one namespace:
  - A page that makes its own app (a block, or a ``with``, calls ``Celery(``) runs as a
    program: all its blocks in one fresh Python process (tests/docs_runner.py), from an empty
    namespace. Its ``redis://localhost:6379/<n>`` URLs point at the test session's Redis,
    database ``8 + n`` (emptied before and after). A block headed ``# <path>.py`` is a file
    of the page's project: written there, then imported.
  - Any other page runs in this process, from a namespace that starts with ``dedupe`` and
    ``app``: an installed Celery app on the test session's Redis (broker and dedup store),
    with a key prefix and a queue of its own, whose ``app.task`` makes tasks of this app
    alone (``shared=False``: the next test's app would otherwise inherit them). Each block is
    a test of its own, which first runs the page's earlier blocks on a fresh app; after each
    block the app's dedupe settings must pass ``dedupe.install``'s check.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from celery import Celery

import dedupe
from dedupe.values.config import DedupeConfig

from .helpers import ROOT, require

DOCS = ROOT / "docs"
BLOCK = re.compile(r"^```python\n(.*?)^```", flags=re.MULTILINE | re.DOTALL)
EXAMPLE = re.compile(r"# (examples/\S+)\n")
FILE = re.compile(r"# ([\w/]+\.py)\n")
MARKER = re.compile(r"<!--\s*(not run|with a worker|with)\b:?(.*?)-->\s*\Z", flags=re.DOTALL)
LOCAL_REDIS = re.compile(r"redis://localhost:6379(?:/(\d+))?")
#: The first database of the test Redis that the program pages' URLs point at.
DOCS_DB = 8


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    code: str
    #: "not run", "with", "with a worker", or "" (the comment before the block, if any).
    marker: str = ""
    #: What the marker says: why the block is not run, or the code it runs first.
    detail: str = ""

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def example(self) -> str | None:
        found = EXAMPLE.match(self.code)
        return found.group(1) if found else None

    @property
    def file(self) -> str | None:
        found = FILE.match(self.code)
        return found.group(1) if found and self.example is None else None

    @property
    def setup(self) -> str:
        return textwrap.dedent(self.detail).strip() if self.marker == "with" else ""


def _blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    blocks = []
    for found in BLOCK.finditer(text):
        line = text.count("\n", 0, found.start()) + 1
        before = text[: found.start()].rstrip()
        comment = before[before.rfind("<!--") :] if before.endswith("-->") else ""
        marked = MARKER.match(comment)
        marker, detail = (marked.group(1), marked.group(2)) if marked else ("", "")
        blocks.append(Block(page, line, found.group(1), marker, detail))
    return blocks


PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
BLOCKS = [block for page in PAGES for block in _blocks(page)]
EXAMPLES = [block for block in BLOCKS if block.example is not None]
RUNNABLE = [block for block in BLOCKS if block.example is None and block.marker != "not run"]
PROGRAMS = {block.page for block in RUNNABLE if "Celery(" in block.code or "Celery(" in block.setup}
IN_PROCESS = [block for block in RUNNABLE if block.page not in PROGRAMS]
IN_PROGRAMS = [block for block in RUNNABLE if block.page in PROGRAMS]


def test_the_docs_show_the_examples_and_run_blocks() -> None:
    assert {block.example for block in EXAMPLES} >= {
        "examples/fastapi_app/main.py",
        "examples/django_site/reports/views.py",
    }
    # A handful, on the pages users copy from first.
    pages = {block.page.name for block in RUNNABLE}
    assert {"README.md", "index.md", "first-project.md", "testing.md"} <= pages, pages


def test_a_block_not_run_says_why() -> None:
    unexplained = [b.name for b in BLOCKS if b.marker == "not run" and not b.detail.strip()]
    assert unexplained == []


@pytest.mark.parametrize("block", EXAMPLES, ids=[block.name for block in EXAMPLES])
def test_a_docs_snippet_is_the_examples_code(block: Block) -> None:
    assert block.example is not None
    snippet = block.code.split("\n", 1)[1]
    assert snippet.strip() in (ROOT / block.example).read_text(encoding="utf-8")


@pytest.mark.parametrize("block", IN_PROCESS, ids=[block.name for block in IN_PROCESS])
def test_a_docs_block_runs(block: Block, make_app: Callable[..., Celery]) -> None:
    # (Files and workers are for pages that run as programs.)
    assert block.file is None
    assert block.marker != "with a worker"
    app = make_app()
    app.task = functools.partial(app.task, shared=False)  # type: ignore[method-assign]
    namespace = {
        "__name__": f"docs_{block.page.stem.replace('-', '_')}",
        "app": app,
        "dedupe": dedupe,
    }
    earlier = [
        other for other in IN_PROCESS if other.page == block.page and other.line < block.line
    ]
    for other in [*earlier, block]:
        if other.setup:
            exec(compile(other.setup, f"{other.name} (its setup)", "exec"), namespace)
        exec(compile(other.code, other.name, "exec"), namespace)
        DedupeConfig.from_app(app)  # (a setting a block wrote must be one dedupe takes)


@pytest.mark.parametrize("block", IN_PROGRAMS, ids=[block.name for block in IN_PROGRAMS])
def test_a_program_pages_block_runs(
    block: Block, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    if "import django" in "".join(b.setup + b.code for b in IN_PROGRAMS if b.page == block.page):
        require(
            importlib.util.find_spec("django") is not None,
            "Django is not installed (pip install -e '.[examples]')",
        )
    outcomes = _program_run(block.page, redis_url, tmp_path_factory)
    if block.name not in outcomes:
        failed = next(name for name, error in outcomes.items() if error is not None)
        pytest.fail(f"not reached: {failed} failed before it")
    assert outcomes[block.name] is None, outcomes[block.name]


_RUNS: dict[Path, dict[str, str | None]] = {}


def _program_run(
    page: Path, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str | None]:
    """Each block's error (None: it ran) in one run of the page's blocks, made once."""
    if page in _RUNS:
        return _RUNS[page]
    blocks = [block for block in IN_PROGRAMS if block.page == page]
    server = redis_url.rsplit("/", 1)[0]

    def local(code: str) -> str:
        return LOCAL_REDIS.sub(lambda m: f"{server}/{DOCS_DB + int(m.group(1) or 0)}", code)

    used = {
        DOCS_DB + int(n or 0)
        for block in blocks
        for n in LOCAL_REDIS.findall(block.code + block.setup)
    }
    workdir = tmp_path_factory.mktemp(page.stem)
    results = workdir / "results.jsonl"
    plan = {
        "project": str(workdir / "project"),
        "module": f"docs_{page.stem.replace('-', '_').lower()}",
        "results": str(results),
        "blocks": [
            {
                "name": block.name,
                "code": local(block.code),
                "setup": local(block.setup),
                "file": block.file,
                "worker": block.marker == "with a worker",
            }
            for block in blocks
        ],
    }
    (workdir / "project").mkdir()
    _empty(redis_url, used)
    try:
        ran = subprocess.run(
            [sys.executable, str(ROOT / "tests" / "docs_runner.py")],
            input=json.dumps(plan),
            capture_output=True,
            text=True,
            cwd=workdir / "project",
            timeout=120,
        )
    finally:
        _empty(redis_url, used)
    outcomes: dict[str, str | None] = {}
    for line in results.read_text(encoding="utf-8").splitlines() if results.exists() else []:
        outcome = json.loads(line)
        outcomes[outcome["name"]] = outcome["error"]
    if not outcomes or (ran.returncode != 0 and all(e is None for e in outcomes.values())):
        outcomes[blocks[0].name] = f"the run failed ({ran.returncode}):\n{ran.stderr}"
    for name, error in outcomes.items():
        if error is not None:
            outcomes[name] = f"{error}\n--- its output ---\n{ran.stdout}\n{ran.stderr}"
    _RUNS[page] = outcomes
    return outcomes


def _empty(redis_url: str, databases: set[int]) -> None:
    server = redis_url.rsplit("/", 1)[0]
    for db in databases:
        client = redis.Redis.from_url(f"{server}/{db}")
        client.flushdb()
        client.close()
