"""A script is loaded behind the prelude's definitions it uses, and only those."""

from __future__ import annotations

import re
from importlib import resources

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from dedupe.store.store import script_text, used_prelude

LUA = resources.files("dedupe.store") / "lua"
PRELUDE = (LUA / "_prelude.lua").read_text(encoding="utf-8")
SCRIPTS = sorted(p.name[:-4] for p in LUA.iterdir() if p.name.endswith(".lua") and p.name[0] != "_")
DEFINED = set(re.findall(r"^local (?:function )?(\w+)", PRELUDE, re.M))


def _prelude_of(uses: list[set[int]]) -> str:
    """A prelude of functions f0, f1, ... where each calls the earlier ones in ``uses``."""
    bodies = [" + ".join(f"f{u}()" for u in sorted(calls)) or "1" for calls in uses]
    return "".join(
        f"-- f{n}\nlocal function f{n}()\n  return {body}\nend\n\n" for n, body in enumerate(bodies)
    )


@st.composite
def _calls(draw: st.DrawFn) -> tuple[list[set[int]], set[int]]:
    """Who calls whom among some functions (each only earlier ones), and what a body calls."""
    size = draw(st.integers(1, 8))
    uses = [draw(st.sets(st.integers(0, n - 1))) if n else set() for n in range(size)]
    return uses, draw(st.sets(st.integers(0, size - 1)))


@given(_calls())
def test_a_script_gets_what_it_calls_and_what_that_calls_in_the_preludes_order(
    calls: tuple[list[set[int]], set[int]],
) -> None:
    uses, called = calls
    reached, todo = set(), list(called)
    while todo:
        n = todo.pop()
        if n not in reached:
            reached.add(n)
            todo.extend(uses[n])
    body = "return " + (" + ".join(f"f{n}()" for n in sorted(called)) or "0")
    kept = used_prelude(_prelude_of(uses), body)
    assert re.findall(r"^local function f(\d+)", kept, re.M) == [
        str(n) for n in range(len(uses)) if n in reached
    ]


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_loaded_script_defines_every_prelude_name_it_uses(name: str) -> None:
    text = script_text(name)
    defined = set(re.findall(r"^local (?:function )?(\w+)", text, re.M))
    used = set(re.findall(r"[A-Za-z_]\w*", text)) & DEFINED
    assert used <= defined, f"{name}.lua uses {sorted(used - defined)} without their definitions"


def test_a_script_that_uses_nothing_of_the_prelude_is_loaded_alone() -> None:
    assert script_text("confirm").strip() == (LUA / "confirm.lua").read_text().strip()


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_loaded_script_compiles_on_redis(name: str, redis_client: redis.Redis) -> None:
    redis_client.script_load(script_text(name))
