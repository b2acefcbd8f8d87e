"""The examples in the package's docstrings run, and say what they return.

Modules whose examples need a broker, a worker or a web framework show them as plain code
blocks instead (``.. code-block:: python``); the README's examples are run by test_readme.
"""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

RUNNABLE = [
    "dedupe.beat.ticks",
    "dedupe.cli",
    "dedupe.producer.message_repr",
    "dedupe.runs.inventory",
    "dedupe.store.store",
    "dedupe.values.canonical",
    "dedupe.values.config",
    "dedupe.values.header",
    "dedupe.values.keys",
    "dedupe.values.key_derivation",
    "dedupe.values.latest",
    "dedupe.values.limits",
    "dedupe.values.options",
    "dedupe.values.packing",
    "dedupe.values.record",
    "dedupe.values.timing",
    "dedupe.values.urls",
    "dedupe.webview.rows",
    "dedupe.webview.security",
    "dedupe.worker.deferral",
]
PACKAGE = Path(__file__).resolve().parent.parent / "dedupe"


@pytest.mark.parametrize("name", RUNNABLE)
def test_the_examples_of_a_module_run_as_written(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.attempted > 0, f"{name} has no examples left: drop it from RUNNABLE"
    assert result.failed == 0


def test_every_module_with_interactive_examples_is_run() -> None:
    with_examples = {
        "dedupe." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        for path in PACKAGE.rglob("*.py")
        if ">>> " in path.read_text(encoding="utf-8")
    }
    assert with_examples == set(RUNNABLE)
