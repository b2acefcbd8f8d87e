"""What the tree says about itself is true.

- No file in git holds a merge's conflict markers.
- Every place in the repository that a comment, a docstring, a Lua script's header or a
  Markdown page names exists:
  - a path: ``dedupe/store/lua/claim.lua``, ``docs/design-notes.md``, ``tests/helpers.py:40``,
    or one relative to the package, as the docs write them (``values/keys.keys_for``: the
    module, then an attribute of it; ``lua/claim.lua``);
  - a bare script or module file name: a ``claim.lua`` is in dedupe/store/lua/, a
    ``helpers.py`` somewhere in the tree;
  - a dotted name: ``dedupe.values.redelivery`` is a module, ``dedupe.values.keys.keys_for``
    an attribute of one (also inside ``:mod:`` or ``:func:`` roles).

Comments and docstrings are read in dedupe/, tests/, benchmarks/ and noxfile.py (doctest
examples left out: tests/test_doctests.py runs them); on the Markdown pages (docs/*.md,
README.md, CONTRIBUTING.md) the inline code spans, where a dotted name may also be one of the
package's loggers (``dedupe.redis``).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import io
import re
import subprocess
import textwrap
import tokenize
from collections.abc import Iterator
from pathlib import Path

from .helpers import ROOT

PACKAGE = ROOT / "dedupe"
SCRIPTS = PACKAGE / "store" / "lua"
#: Where a relative path may start, tried in order: ``docs/x.md``, ``values/keys.py``,
#: ``lua/claim.lua``, ``static/`` (the web view's).
BASES = (ROOT, PACKAGE, PACKAGE / "store", PACKAGE / "webview")
#: Where comments and docstrings are read (and noxfile.py); the Markdown pages besides docs/*.md.
CODE_FOLDERS = ("dedupe", "tests", "benchmarks")
PAGES = ("README.md", "CONTRIBUTING.md")
#: Suffixes that make a name's last part a file, not an attribute.
FILE_SUFFIXES = frozenset({"py", "lua", "md", "toml", "yml", "json", "png", "html", "css", "js"})

#: A path with at least one folder; the first folder decides whether it is the repository's.
PATH = re.compile(r"(?<![\w./:~-])((?:[\w.-]+/)+[\w.-]*)")
#: A dotted name of the package's (or of the tests').
DOTTED = re.compile(r"(?<![\w./-])((?:dedupe|tests)(?:\.\w+)+)")
#: A script or module file named without its folder.
BARE_FILE = re.compile(r"(?<![\w./-])(\w+\.(?:lua|py))\b")
#: An inline code span of a Markdown page.
SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```.*?^```", flags=re.MULTILINE | re.DOTALL)
LOGGER = re.compile(r"getLogger\(\"(dedupe\.[\w.]+)\"\)")

CONFLICT_START, CONFLICT_BASE, CONFLICT_MIDDLE, CONFLICT_END = (
    "<<<<<<< ",
    "||||||| ",
    "=======",
    ">>>>>>> ",
)


def _tracked() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, text=True
    ).stdout
    return [ROOT / name for name in listed.split("\0") if name and (ROOT / name).is_file()]


TRACKED = _tracked()
TRACKED_NAMES = {path.name for path in TRACKED}


def _text_of(path: Path) -> str | None:
    """The file's text, or None for a binary file."""
    raw = path.read_bytes()
    return None if b"\0" in raw else raw.decode("utf-8", errors="replace")


def _conflict_markers(text: str) -> Iterator[tuple[int, str]]:
    inside = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith(CONFLICT_START):
            inside = True
        elif line.startswith(CONFLICT_END):
            inside = False
        elif not (inside and (line == CONFLICT_MIDDLE or line.startswith(CONFLICT_BASE))):
            continue
        yield number, line


def test_no_file_holds_merge_conflict_markers() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line}"
        for path in TRACKED
        if (text := _text_of(path)) is not None
        for number, line in _conflict_markers(text)
    ]
    assert found == [], "conflict markers:\n" + "\n".join(found)


# -- what the tree names ---------------------------------------------------------------------


def _without_doctests(docstring: str) -> str:
    # An example and its output are code (a Redis key "dedupe/view:on" is no path).
    kept, in_example = [], False
    for line in docstring.splitlines():
        stripped = line.strip()
        if stripped.startswith((">>>", "...")):
            in_example = True
        elif not stripped:
            in_example = False
        if not in_example:
            kept.append(line)
    return "\n".join(kept)


def _python_prose(path: Path) -> Iterator[tuple[int, str]]:
    source = path.read_text(encoding="utf-8")
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=False)
            if docstring:
                line = node.body[0].lineno
                for offset, text in enumerate(_without_doctests(docstring).splitlines()):
                    yield line + offset, text


def _lua_prose(path: Path) -> Iterator[tuple[int, str]]:
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        found = re.search(r"(?:^|\s)(--.*)", line)
        if found:
            yield number, found.group(1)


def _markdown_spans(path: Path) -> Iterator[tuple[int, str]]:
    text = path.read_text(encoding="utf-8")
    # Fenced blocks are code (tests/test_docs.py runs them); blanked, their lines still count.
    text = FENCE.sub(lambda block: "\n" * block.group(0).count("\n"), text)
    for number, line in enumerate(text.splitlines(), 1):
        for span in SPAN.findall(line):
            yield number, span


def _sources() -> Iterator[tuple[Path, Iterator[tuple[int, str]]]]:
    for path in TRACKED:
        relative = path.relative_to(ROOT)
        if path == Path(__file__).resolve():
            continue  # (its own comments name made-up paths, as examples)
        if path.suffix == ".py" and (
            relative.parts[0] in CODE_FOLDERS or path.name == "noxfile.py"
        ):
            yield path, _python_prose(path)
        elif path.suffix == ".lua" and relative.parts[0] == "dedupe":
            yield path, _lua_prose(path)
        elif path.suffix == ".md" and (relative.parent == Path("docs") or str(relative) in PAGES):
            yield path, _markdown_spans(path)


def _has_attribute(owner: object, name: str) -> bool:
    if hasattr(owner, name):
        return True
    if not inspect.isclass(owner):
        return False
    # An instance's attribute: a field (annotated in the class body) or set in a method.
    for klass in inspect.getmro(owner):
        if name in getattr(klass, "__annotations__", {}):
            return True
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        if re.search(rf"\bself\.{re.escape(name)}\s*(?::[^=\n]+)?=", source):
            return True
    return False


def _resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module, or a chain of attributes of one."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            spec = importlib.util.find_spec(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        if spec is None:
            continue
        if split == len(parts):
            return True  # a module: found without running it (dedupe.beat.database needs Django)
        owner: object = importlib.import_module(".".join(parts[:split]))
        for name in parts[split:]:
            if not _has_attribute(owner, name):
                return False
            owner = getattr(owner, name, None)
        return True
    return False


def _path_exists(path: str, *, template: bool) -> bool:
    """Whether ``path`` (from one of BASES) is a file or a folder, or a module's attribute; a
    ``template`` (``docs/images/flow-<name>.png``) is the start of a tracked file's path."""
    path = path.rstrip(".")
    first = path.split("/", 1)[0]
    if first == "..":
        return False  # outside the repository: not there for its readers
    bases = [base for base in BASES if (base / first).is_dir()]
    if not bases:
        return True  # not a path of this repository's (a rate, a URL's tail, celery/celery#1)
    for base in bases:
        if (base / path).exists():
            return True
        if template and any(str(tracked).startswith(str(base / path)) for tracked in TRACKED):
            return True
        folder, _, last = path.rpartition("/")
        module, _, attributes = last.partition(".")
        suffix = attributes.rsplit(".", 1)[-1]
        if (
            attributes
            and suffix not in FILE_SUFFIXES
            and (base / folder / f"{module}.py").is_file()
        ):
            dotted = ".".join((base / folder / module).relative_to(ROOT).parts)
            if _resolves(f"{dotted}.{attributes}"):
                return True
    return False


def _bare_file_exists(name: str) -> bool:
    return (SCRIPTS / name).is_file() if name.endswith(".lua") else name in TRACKED_NAMES


def _loggers() -> set[str]:
    return {
        name
        for path in PACKAGE.rglob("*.py")
        for name in LOGGER.findall(path.read_text(encoding="utf-8"))
    }


def _stale_names(path: Path, text: str, loggers: set[str]) -> Iterator[str]:
    for found in PATH.finditer(text):
        template = text[found.end() : found.end() + 1] in ("<", "{", "*")
        if not _path_exists(found.group(1), template=template):
            yield found.group(1)
    for found in DOTTED.finditer(text):
        name = found.group(1)
        if not (_resolves(name) or (path.suffix == ".md" and name in loggers)):
            yield name
    for found in BARE_FILE.finditer(text):
        if not _bare_file_exists(found.group(1)):
            yield found.group(1)


def test_every_path_and_module_named_in_comments_and_docs_exists() -> None:
    loggers = _loggers()
    stale = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path, prose in _sources()
        for line, text in prose
        for name in _stale_names(path, text, loggers)
    ]
    assert stale == [], "named but not there:\n" + "\n".join(stale)
