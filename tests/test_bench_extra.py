"""``./noxw -s bench`` runs on a fresh clone: every third-party module a benchmark imports is
installed by the package's own dependencies or its ``bench`` extra (or what they require).
Read from pyproject.toml and the installed distributions' metadata; nothing is installed."""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import sys
from pathlib import Path

import tomllib
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from .helpers import ROOT

BENCHMARKS = sorted((ROOT / "benchmarks").glob("*.py"))
OURS = {"dedupe", "benchmarks", "tests"}


def _installed_by(requirements: list[str]) -> set[str]:
    """The distributions ``requirements`` install, theirs included (as far as this
    environment's metadata tells: one not installed here counts, without what it needs)."""
    environment = default_environment()
    found: set[str] = set()
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [Requirement(text) for text in requirements]
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        extras = frozenset(requirement.extras)
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        found.add(name)
        try:
            needs = metadata.requires(requirement.name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in needs:
            need = Requirement(text)
            marker = need.marker
            if marker is None or any(
                marker.evaluate({**environment, "extra": extra}) for extra in extras | {""}
            ):
                todo.append(need)
    return found


def _third_party_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.partition(".")[0])
    return names - OURS - set(sys.stdlib_module_names)


def test_every_module_a_benchmark_imports_comes_with_the_bench_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    installed = _installed_by(
        [*project["dependencies"], *project["optional-dependencies"]["bench"]]
    )
    distributions = metadata.packages_distributions()
    missing = {
        f"{path.name}: {module}"
        for path in BENCHMARKS
        for module in _third_party_imports(path)
        if not {canonicalize_name(name) for name in distributions.get(module, [module])} & installed
    }
    assert missing == set()
