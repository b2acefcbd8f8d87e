"""Runs the code blocks of one page of the docs as a user's program runs: in this fresh
process, in order, in one namespace (see tests/test_docs.py, which starts it).

stdin: a JSON plan, ``{"project": dir, "module": name, "results": path, "blocks": [...]}``,
each block ``{"name", "code", "setup", "file", "worker"}``. Each block's outcome is one JSON
line in ``results``: ``{"name", "error"}`` (``error`` None when it ran); the first block that
fails ends the run.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import sys
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from celery import Celery
from celery.contrib.testing.worker import start_worker


def main() -> int:
    # A warning is an error, as in the test suite (pyproject.toml, filterwarnings).
    warnings.simplefilter("error")
    warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"(celery|kombu)\.")
    plan = json.load(sys.stdin)
    project = Path(plan["project"])
    sys.path.insert(0, str(project))
    namespace: dict[str, Any] = {"__name__": plan["module"]}
    modules: list[Any] = []
    with open(plan["results"], "a", encoding="utf-8") as results:
        for block in plan["blocks"]:
            try:
                run(block, namespace, project, modules)
                error = None
            except BaseException:
                error = traceback.format_exc()
            results.write(json.dumps({"name": block["name"], "error": error}) + "\n")
            results.flush()
            if error is not None:
                return 1
    return 0


def run(
    block: dict[str, Any], namespace: dict[str, Any], project: Path, modules: list[Any]
) -> None:
    if block["setup"]:
        exec(compile(block["setup"], f"{block['name']} (its setup)", "exec"), namespace)
    if block["file"]:
        # A file of the page's project: written where the program imports it from.
        path = project / block["file"]
        path.parent.mkdir(parents=True, exist_ok=True)
        for package in path.relative_to(project).parents:
            if package != Path("."):
                (project / package / "__init__.py").touch()
        path.write_text(block["code"], encoding="utf-8")
        importlib.invalidate_caches()
        dotted = ".".join(Path(block["file"]).with_suffix("").parts)
        modules.append(importlib.import_module(dotted))
        return
    code = compile(block["code"], block["name"], "exec")
    with worker_for(namespace, modules) if block["worker"] else contextlib.nullcontext():
        exec(code, namespace)


@contextlib.contextmanager
def worker_for(namespace: dict[str, Any], modules: list[Any]) -> Iterator[None]:
    """Celery's in-process test worker (solo pool) for the page's app: ``app`` in the
    namespace, else the ``app`` of one of the page's files (``celery -A proj`` finds it so)."""
    apps = [namespace.get("app"), *(getattr(module, "app", None) for module in modules)]
    app = next(app for app in apps if isinstance(app, Celery))
    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=30):
        yield


if __name__ == "__main__":
    sys.exit(main())
