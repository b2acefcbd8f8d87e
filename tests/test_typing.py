"""The README's examples type-check under ``mypy --strict``: what users write against the
public API (``result.deduplicated``, ``result.holder``) is typed, not ``Any``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import ROOT

pytestmark = pytest.mark.slow

README = (ROOT / "README.md").read_text()
# The blocks that stand alone in the README; the ones headed by an example's path are that
# example's code, which test_readme pins and the example's own module holds.
BLOCKS = [
    block
    for block in re.findall(r"```python\n(.*?)```", README, flags=re.DOTALL)
    if not block.startswith("# examples/")
]

# What the README's blocks take from the text around them, given only to a block that uses
# the name without defining it.
CONTEXT = {
    "app": 'app = Celery("proj", broker="redis://localhost:6379/0")\ndedupe.install(app)\n',
    "refresh_report": (
        "@app.task(base=dedupe.DedupeTask)\ndef refresh_report(report_id: int) -> None: ...\n"
    ),
    "report": "@app.task(base=dedupe.DedupeTask)\ndef report(day: str) -> None: ...\n",
    "sync_customer": (
        "@app.task(base=dedupe.DedupeTask, unique=True)\n"
        "def sync_customer(customer_id: int, full: bool = False) -> None: ...\n"
    ),
    "SomeScheduler": "from celery.beat import Scheduler as SomeScheduler\n",
}
IMPORTS = "from celery import Celery\n\nimport dedupe\n"


def _defines(block: str, name: str) -> bool:
    definition = rf"^(def|class) {name}\b|^{name} =|import .*\b{name}$"
    return re.search(definition, block, re.MULTILINE) is not None


def user_module(block: str) -> str:
    """``block`` with the imports and names it takes from its context."""
    needed = [
        code
        for name, code in CONTEXT.items()
        if re.search(rf"\b{name}\b", block) and not _defines(block, name)
    ]
    if any("@app.task" in code for code in needed) and not _defines(block, "app"):
        needed.insert(0, CONTEXT["app"])
    return IMPORTS + "".join(dict.fromkeys(needed)) + "\n" + block


def test_the_readme_has_standalone_examples_to_check() -> None:
    assert any("deduplicated" in block and "holder" in block for block in BLOCKS)


def test_the_readme_examples_type_check_under_mypy_strict(tmp_path: Path) -> None:
    for number, block in enumerate(BLOCKS):
        (tmp_path / f"readme_example_{number}.py").write_text(user_module(block))
    checked = subprocess.run(
        # The package as a user's checker sees an installed one: its types used, its own
        # findings not reported (the lint session checks it).
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--follow-imports=silent",
            "--no-incremental",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "MYPYPATH": str(ROOT)},
        cwd=tmp_path,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
