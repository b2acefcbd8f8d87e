"""The store's lines of ``key_concurrency`` keys whose waiting calls are held in Redis and
handed on as slots free (hold_or_push.lua, turn.lua, end_turn.lua, leave_turn.lua,
hand_on.lua; their keys: ``line_keys`` in the prelude)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import redis.cluster
from redis.commands.core import Script

from dedupe.errors import UnexpectedReply
from dedupe.store.redis_errors import reraise_unavailable
from dedupe.values.limits import LINE_KEY_NAMES, index_member, limit_keys, line_index

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
    """turn.lua's answer: the run's verdict (0 runs, n>0 waits nth, -1 a copy dropped, -2 the
    backstop of a call that waits still), and the calls a lapsed slot was handed to on the
    way."""

    verdict: int
    handed: list[Handed]


@dataclass(frozen=True, slots=True)
class WaitingCall:
    """A call waiting for its turn, for the CLI and the web view: its key, task id, position
    (1 = next), whether a slot was handed to it (``key_concurrency``), and when it is due
    (``key_rate_limit``: its reserved start, seconds since the epoch; None: when a slot
    frees)."""

    key: str
    task_id: str
    position: int
    handed: bool = False
    due_at: float | None = None


class LineCommands(StoreBase):
    """Held and handed calls of ``key_concurrency`` keys."""

    @property
    def _cluster(self) -> bool:
        return isinstance(self.client, redis.cluster.RedisCluster)

    _hold_or_push: Script
    _turn: Script
    _end_turn: Script
    _leave_turn: Script
    _hand_on: Script
    _settle: Script

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
                [*_line(keys, cluster=self._cluster), *lists, *expiring],
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
        backstop: bool = False,
    ) -> Turn:
        """A run asks for its turn (turn.lua): it runs in its handed slot or a free one, or
        waits held in Redis with ``options`` (Celery's, JSON) to publish it again;
        ``backstop``: the worker keeps a copy of a waiting call in the broker as well."""
        member = index_member(limit, lease_ms, _base(keys))
        mark = "B" if backstop else "C"
        with reraise_unavailable("turn", keys["slots"]):
            reply = self._run(
                self._turn,
                _line(keys, cluster=self._cluster),
                [task_id, token, lease_ms, limit, ttl_ms, options, member, mark],
            )
        return Turn(*_first_and_handed("turn", reply))

    def end_turn(
        self, keys: Mapping[str, str], run: str, *, lease_ms: int, limit: int
    ) -> tuple[int, list[Handed]]:
        """A run's end frees its slot (``run``: "<task id> <token>", or a task id for any of
        its runs) and hands it on (end_turn.lua): the slots freed, and the calls handed one."""
        member = index_member(limit, lease_ms, _base(keys))
        with reraise_unavailable("end_turn", keys["slots"]):
            reply = self._run(
                self._end_turn, _line(keys, cluster=self._cluster), [run, lease_ms, limit, member]
            )
        return _first_and_handed("end_turn", reply)

    def leave_turn(
        self, keys: Mapping[str, str], task_id: str, *, lease_ms: int, limit: int
    ) -> tuple[bool, list[Handed]]:
        """A call whose message was dropped (revoked, expired) leaves its line, and a slot it
        was handed goes on (leave_turn.lua)."""
        member = index_member(limit, lease_ms, _base(keys))
        with reraise_unavailable("leave_turn", keys["line"]):
            reply = self._run(
                self._leave_turn,
                _line(keys, cluster=self._cluster),
                [task_id, lease_ms, limit, member],
            )
        left, handed = _first_and_handed("leave_turn", reply)
        return left == 1, handed

    def hand_on_lapsed(self, index: str, most: int = 50) -> list[Handed]:
        """Hand on the slots of the lines in ``index`` whose first lease is over (hand_on.lua:
        one server only)."""
        with reraise_unavailable("hand_on", index):
            reply = self._run(self._hand_on, [index], [most])
        if not isinstance(reply, list):
            raise UnexpectedReply("hand_on", reply)
        return _handed("hand_on", reply)

    def settle_lines(self, index: str, seen: str, run: str, lease_ms: int) -> bool:
        """The dedup Redis restarted or failed over since this worker's last look (its run
        id was ``seen``, is ``run``): the lines settle for ``lease_ms`` (settle.lua). True
        if they settle from now."""
        with reraise_unavailable("settle", index):
            reply = self._run(self._settle, [index], [seen, run, lease_ms])
        return integer_reply("settle", reply) == 1

    def name_limited(
        self, key: str, limited: Collection[str], others: Collection[str], ttl_ms: int
    ) -> None:
        """Say which task names are limited (``limited``) and which are not (``others``, a
        task that lost its limit), in the set ``key``, kept ``ttl_ms``."""

        def write() -> None:
            with self.client.pipeline(transaction=False) as pipe:
                if others:
                    pipe.srem(key, *others)
                if limited:
                    pipe.sadd(key, *limited)
                    pipe.pexpire(key, ttl_ms)
                pipe.execute()

        with reraise_unavailable("name_limited", key):
            self._command(write)

    def is_named_limited(self, key: str, name: str) -> bool:
        """Do the workers know ``name`` as a limited task (the set ``key``)?"""
        with reraise_unavailable("is_named_limited", key):
            return bool(self._command(lambda: self.client.sismember(key, name)))

    def waiting_under(self, prefix: str, pattern: str = "*", most: int = 1000) -> list[WaitingCall]:
        """Every call waiting under ``prefix`` (keys matching ``<prefix>:<pattern>``): in a
        ``key_concurrency`` line, then the reserved starts of ``key_rate_limit`` keys (a
        read: SCAN, then a ZRANGE per key of the calls still wanted; ``most`` calls at
        most). One server only."""
        found: list[WaitingCall] = []
        if most <= 0:
            return found
        for suffix, read in ((":line", self.waiting_calls), (":plan", self.planned_starts)):
            keys = self.client.scan_iter(match=f"{prefix}:{pattern}{suffix}", count=1000)
            for key in keys:
                base = (key.decode() if isinstance(key, bytes) else str(key)).removesuffix(suffix)
                # (A long line is read as far as is wanted, never whole.)
                found.extend(read(limit_keys(base), most - len(found)))
                if len(found) >= most:
                    return found
        return found

    def planned_starts(self, keys: Mapping[str, str], most: int | None = None) -> list[WaitingCall]:
        """The calls of a rate-limited key whose start is reserved and not made yet, in the
        order of their starts, each due then (the first ``most``; None: all)."""
        last = _last(most)
        with reraise_unavailable("planned_starts", keys["plan"]):
            plan = self._command(lambda: self.client.zrange(keys["plan"], 0, last, withscores=True))
        base = keys["plan"].removesuffix(":plan")
        return [
            WaitingCall(base, _text("plan", task_id), position, due_at=float(score) / 1000)
            for position, (task_id, score) in enumerate(cast("list[tuple[bytes, float]]", plan), 1)
        ]

    def waiting_calls(self, keys: Mapping[str, str], most: int | None = None) -> list[WaitingCall]:
        """The calls waiting in a key's line, in call order (a read: two ZRANGEs; the first
        ``most`` calls, None: all)."""

        def read() -> tuple[list[bytes], list[bytes]]:
            line = self.client.zrange(keys["line"], 0, _last(most))
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


def _last(most: int | None) -> int:
    # ZRANGE's last index of the first ``most`` members (-1: to the end).
    return -1 if most is None else max(most, 1) - 1


def _line(keys: Mapping[str, str], *, cluster: bool = False) -> list[str]:
    # On a Cluster every key of a script is in the line's slot: its index is its own (no
    # look at lapsed leases, nor settling, there: see dedupe.runs.line_sweep).
    base = _base(keys)
    index = f"{base}:lines" if cluster else line_index(base)
    return [index if name == "index" else keys[name] for name in LINE_KEY_NAMES]


def _base(keys: Mapping[str, str]) -> str:
    return keys["slots"].removesuffix(":slots")


def _first_and_handed(script: str, reply: object) -> tuple[int, list[Handed]]:
    # The reply of a script that hands slots on (with_handed in the prelude): a number,
    # then each call handed a slot with its options.
    if not isinstance(reply, list) or not reply:
        raise UnexpectedReply(script, reply)
    return integer_reply(script, reply[0]), _handed(script, reply[1:])


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
