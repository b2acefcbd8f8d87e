"""The store: every read and write celery-dedupe makes to the dedup Redis, one Lua script per
state transition and one round trip per call.

Scripts live in ``dedupe/store/lua/`` (each headed by its KEYS, ARGV and replies), are
loaded behind the prelude's definitions they use (:func:`script_text`), registered once on
the store's client and run through a script runner
(:class:`~dedupe.store.runner.ScriptCalls`: one server's or a Cluster's), EVALSHA with a
NOSCRIPT fallback, on a connection of each thread's own. Their replies are read by
:mod:`dedupe.store.replies`; redis-py's errors are sorted by :mod:`dedupe.store.redis_errors`.

Its methods are grouped by concept in :mod:`dedupe.store.commands`, one mixin each (as
redis-py composes its client): enqueues, publishes, a run's side, flow control per key,
recovery from a lost dataset, plain commands. :class:`Store` composes them with the state
they share.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

import redis.cluster
from redis.commands.core import Script

from dedupe.values import defaults

from .clients import DedupRedis
from .cluster_runner import ClusterScriptRunner
from .commands.admin import AdminCommands
from .commands.enqueue import EnqueueCommands
from .commands.flow_control import FlowControlCommands
from .commands.lines import LineCommands
from .commands.publish import PublishCommands
from .commands.reaping import ReapingCommands
from .commands.recovery import RecoveryCommands
from .commands.runs import RunCommands
from .green_pool import script_runner

__all__ = ["Store", "script_text", "used_prelude"]


#: A top-level definition of the prelude: a local function or a local value.
_DEFINITION = re.compile(r"local (?:function )?([A-Za-z_]\w*)")
_NAME = re.compile(r"[A-Za-z_]\w*")


# Redis runs a script's whole text on every EVALSHA: each ``local function`` of the prelude
# is a closure made again on every call, used or not. The whole prelude cost Redis about
# 3 us a call (a confirm: 4.2 us with it, 1.0-1.6 without), twice on every accepted call.
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


@cache  # (one prelude, read for each of the store's scripts)
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


class Store(
    EnqueueCommands,
    PublishCommands,
    RunCommands,
    FlowControlCommands,
    LineCommands,
    RecoveryCommands,
    ReapingCommands,
    AdminCommands,
):
    """Every read and write celery-dedupe makes to Redis."""

    def __init__(
        self,
        client: DedupRedis,
        *,
        busy_poll: float = defaults.BUSY_POLL_US / 1e6,
        budget: float = defaults.CALL_BUDGET,
        remember_duplicates: float = 0.0,
    ) -> None:
        """``remember_duplicates``: the longest a thread answers a repeated duplicate from
        memory (:meth:`remembered`; 0: never; one server only, not a Cluster)."""
        self.client = client
        if isinstance(client, redis.cluster.RedisCluster):
            self._run = ClusterScriptRunner(client, busy_poll, budget)
        else:
            self._run = script_runner(client, busy_poll, budget, remember_for=remember_duplicates)
        self._enqueue = self._register("enqueue")
        self._enqueue_many = self._register("enqueue_many")
        self._claim = self._register("claim")
        self._renew = self._register("renew")
        self._requeue = self._register("requeue")
        self._wait = self._register("wait")
        self._restore = self._register("restore")
        self._restore_run_lock = self._register("restore_run_lock")
        self._release = self._register("release")
        self._cancel = self._register("cancel")
        self._withdraw = self._register("withdraw")
        self._reap = self._register("reap")
        self._publish = self._register("publish")
        self._confirm = self._register("confirm")
        self._enqueue_latest = self._register("enqueue_latest")
        self._enqueue_latest_many = self._register("enqueue_latest_many")
        self._publish_latest = self._register("publish_latest")
        self._take_latest = self._register("take_latest")
        self._end_latest = self._register("end_latest")
        self._ticket = self._register("ticket")
        self._ticket_publish = self._register("ticket_publish")
        self._slot = self._register("slot")
        self._slot_start = self._register("slot_start")
        self._renew_slot = self._register("renew_slot")
        self._free_slot = self._register("free_slot")
        self._start = self._register("start")
        self._start_publish = self._register("start_publish")
        self._start_ticket_publish = self._register("start_ticket_publish")
        self._leave_line = self._register("leave_line")
        self._free_slots_of = self._register("free_slots_of")
        self._hold_or_push = self._register("hold_or_push")
        self._turn = self._register("turn")
        self._end_turn = self._register("end_turn")
        self._leave_turn = self._register("leave_turn")
        self._hand_on = self._register("hand_on")
        self._settle = self._register("settle")
        self._free_tick = self._register("free_tick")

    def _register(self, name: str) -> Script:
        script: Script = self.client.register_script(script_text(name))
        return script
