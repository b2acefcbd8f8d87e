"""A script's source as it is loaded: the script behind the prelude's definitions it uses.

Redis runs a script's whole text on every EVALSHA, so each ``local function`` of the prelude
is a closure made again on every call, used or not. The whole prelude cost Redis about 3 us
a call (a confirm: 4.2 us with it, 1.0-1.6 without), twice on every accepted call and every
run. A script carries only the definitions it names, and those they name, in the prelude's
order (each is defined before its first use there).
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

__all__ = ["script_text", "used_prelude"]

#: A top-level definition of the prelude: a local function or a local value.
_DEFINITION = re.compile(r"local (?:function )?([A-Za-z_]\w*)")
_NAME = re.compile(r"[A-Za-z_]\w*")


@cache
def script_text(name: str) -> str:
    """The source of ``dedupe/store/lua/<name>.lua`` as it is loaded: the prelude's
    definitions it uses, then the script."""
    package = resources.files("dedupe.store") / "lua"
    prelude = (package / "_prelude.lua").read_text(encoding="utf-8")
    body = (package / f"{name}.lua").read_text(encoding="utf-8")
    return used_prelude(prelude, body) + "\n" + body


def used_prelude(prelude: str, body: str) -> str:
    """The definitions of ``prelude`` that ``body`` names, and those they name in turn, in
    the prelude's order, each with the comment above it.

    >>> prelude = "local function a() return 1 end\\nlocal function b() return a() end\\n"
    >>> used_prelude(prelude, "return b()")
    'local function a() return 1 end\\nlocal function b() return a() end\\n'
    >>> used_prelude(prelude, "return a()")
    'local function a() return 1 end\\n'
    """
    definitions = _definitions(prelude)
    # (A name in a comment or a string may bring in a definition not needed: never one less.)
    wanted: set[str] = set()
    names = [name for name in _NAME.findall(body) if name in definitions]
    while names:
        name = names.pop()
        if name not in wanted:
            wanted.add(name)
            names.extend(n for n in _NAME.findall(definitions[name]) if n in definitions)
    return "".join(text for name, text in definitions.items() if name in wanted)


def _definitions(prelude: str) -> dict[str, str]:
    """Each top-level definition of ``prelude`` (in order), by name: from the comment lines
    right above it to the comment lines of the next one."""
    lines = prelude.splitlines(keepends=True)
    starts: list[tuple[int, str]] = []
    for number, line in enumerate(lines):
        found = _DEFINITION.match(line)
        if found is None:
            continue
        start = number
        while start > 0 and lines[start - 1].startswith("--"):
            start -= 1
        starts.append((start, found.group(1)))
    ends = [start for start, _ in starts[1:]] + [len(lines)]
    spans = zip(starts, ends, strict=True)
    return {name: "".join(lines[start:end]) for (start, name), end in spans}
