"""The store's lines of ``key_concurrency`` keys whose waiting calls are held in Redis and
handed on as slots free (hold_or_push.lua, turn.lua, end_turn.lua, leave_turn.lua,
hand_on.lua; their keys: ``line_keys`` in the prelude)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from redis.commands.core import Script

from dedupe.errors import UnexpectedReply
from dedupe.store.redis_errors import reraise_unavailable
from dedupe.values.limits import LINE_KEY_NAMES, index_member, line_index

from .base import StoreBase, integer_reply

__all__ = ["Handed", "LineCommands", "Turn", "WaitingCall"]


@dataclass(frozen=True, slots=True)
class Handed:
    """A waiting call handed a slot: its message was pushed by the script (``options``
    empty), or is to be published by the worker with Celery's ``options`` (JSON)."""

    task_id: str
    options: str


@dataclass(frozen=True, slots=True)
class Turn:
    """turn.lua's answer: the run's verdict (0 runs, n>0 waits nth, -1 a copy dropped), and
    the calls a lapsed slot was handed to on the way."""

    verdict: int
    handed: list[Handed]


@dataclass(frozen=True, slots=True)
class WaitingCall:
    """A call waiting in a key's line (or handed a slot, not started yet), for the CLI and
    the web view: its key, task id, position (1 = next) and whether a slot was handed to it."""

    key: str
    task_id: str
    position: int
    handed: bool


class LineCommands(StoreBase):
    """Held and handed calls of ``key_concurrency`` keys."""

    _hold_or_push: Script
    _turn: Script
    _end_turn: Script
    _leave_turn: Script
    _hand_on: Script

    def hold_or_push(
        self,
        keys: Mapping[str, str],
        task_id: str,
        *,
        lease_ms: int,
        limit: int,
        ttl_ms: int,
        message: str,
        lists: Sequence[str],
        expiring: Sequence[str] = (),
        expire_ms: int = 0,
    ) -> int:
        """A call on a Redis broker that is the store (hold_or_push.lua): 0 handed a slot and
        its message pushed, or n>0: it waits, held in Redis, the nth to get a slot."""
        member = index_member(limit, lease_ms, _base(keys))
        with reraise_unavailable("hold_or_push", keys["line"]):
            # (Not sent again once written: a second run would push the message twice.)
            reply = self._run(
                self._hold_or_push,
                [*_line(keys), *lists, *expiring],
                [task_id, lease_ms, limit, ttl_ms, message, len(lists), expire_ms, member],
                resend=False,
            )
        return integer_reply("hold_or_push", reply)

    def take_turn(
        self,
        keys: Mapping[str, str],
        task_id: str,
        token: str,
        *,
        lease_ms: int,
        limit: int,
        ttl_ms: int,
        options: str,
    ) -> Turn:
        """A run asks for its turn (turn.lua): it runs in its handed slot or a free one, or
        waits held in Redis with ``options`` (Celery's, JSON) to publish it again."""
        member = index_member(limit, lease_ms, _base(keys))
        with reraise_unavailable("turn", keys["slots"]):
            reply = self._run(
                self._turn,
                _line(keys),
                [task_id, token, lease_ms, limit, ttl_ms, options, member],
            )
        if not isinstance(reply, list) or not reply:
            raise UnexpectedReply("turn", reply)
        return Turn(integer_reply("turn", reply[0]), _handed("turn", reply[1:]))

    def end_turn(
        self, keys: Mapping[str, str], run: str, *, lease_ms: int, limit: int
    ) -> tuple[int, list[Handed]]:
        """A run's end frees its slot (``run``: "<task id> <token>", or a task id for any of
        its runs) and hands it on (end_turn.lua): the slots freed, and the calls handed one."""
        member = index_member(limit, lease_ms, _base(keys))
        with reraise_unavailable("end_turn", keys["slots"]):
            reply = self._run(self._end_turn, _line(keys), [run, lease_ms, limit, member])
        if not isinstance(reply, list) or not reply:
            raise UnexpectedReply("end_turn", reply)
        return integer_reply("end_turn", reply[0]), _handed("end_turn", reply[1:])

    def leave_turn(
        self, keys: Mapping[str, str], task_id: str, *, lease_ms: int, limit: int
    ) -> tuple[bool, list[Handed]]:
        """A call whose message was dropped (revoked, expired) leaves its line, and a slot it
        was handed goes on (leave_turn.lua)."""
        member = index_member(limit, lease_ms, _base(keys))
        with reraise_unavailable("leave_turn", keys["line"]):
            reply = self._run(self._leave_turn, _line(keys), [task_id, lease_ms, limit, member])
        if not isinstance(reply, list) or not reply:
            raise UnexpectedReply("leave_turn", reply)
        return integer_reply("leave_turn", reply[0]) == 1, _handed("leave_turn", reply[1:])

    def hand_on_lapsed(self, index: str, most: int = 50) -> list[Handed]:
        """Hand on the slots of the lines in ``index`` whose first lease is over (hand_on.lua:
        one server only)."""
        with reraise_unavailable("hand_on", index):
            reply = self._run(self._hand_on, [index], [most])
        if not isinstance(reply, list):
            raise UnexpectedReply("hand_on", reply)
        return _handed("hand_on", reply)

    def waiting_calls(self, keys: Mapping[str, str]) -> list[WaitingCall]:
        """The calls waiting in a key's line, in call order (a read: ZRANGE and HKEYS)."""

        def read() -> tuple[list[bytes], list[bytes]]:
            line = self.client.zrange(keys["line"], 0, -1)
            slots = self.client.zrange(keys["slots"], 0, -1)
            return cast("list[bytes]", line), cast("list[bytes]", slots)

        with reraise_unavailable("waiting_calls", keys["line"]):
            line, slots = self._command(read)
        handed = {raw.decode().rsplit(" ", 1)[0] for raw in slots if raw.endswith(b" handed")}
        ids = [raw.decode() for raw in line]
        return [
            WaitingCall(_base(keys), task_id, position, task_id in handed)
            for position, task_id in enumerate(ids, 1)
        ]


def _line(keys: Mapping[str, str]) -> list[str]:
    index = line_index(_base(keys))
    return [index if name == "index" else keys[name] for name in LINE_KEY_NAMES]


def _base(keys: Mapping[str, str]) -> str:
    return keys["slots"].removesuffix(":slots")


def _handed(script: str, reply: Sequence[object]) -> list[Handed]:
    if len(reply) % 2:
        raise UnexpectedReply(script, reply)
    return [
        Handed(_text(script, reply[i]), _text(script, reply[i + 1]))
        for i in range(0, len(reply), 2)
    ]


def _text(script: str, value: object) -> str:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, str):
        return value
    raise UnexpectedReply(script, value)
