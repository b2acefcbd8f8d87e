"""The Redis side: one Lua script per state transition, one round trip per call.

Scripts are registered once on the store's client and called through a ScriptRunner (EVALSHA
with a NOSCRIPT fallback, which also survives a restart or failover that empties the script
cache, on a connection of each thread's own). Script return codes are turned into results in
this module only.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from types import TracebackType
from typing import Any

import redis
from redis.commands.core import Script

from .config import BUSY_POLL
from .errors import RedisUnavailable
from .keys import CallKeys
from .record import Holder, owner_of
from .script_runner import ScriptRunner

__all__ = [
    "Lease",
    "Store",
    "first_holder",
    "held_by",
    "key_names",
    "redis_errors",
    "script_text",
    "translated",
]

logger = logging.getLogger("dedupe.store")

#: What counts as "Redis is unreachable": connection and timeout failures, a server still
#: loading its data, a replica that refuses writes after a failover, a server at its memory
#: limit under noeviction (the policy the README recommends) refusing writes.
redis_errors: tuple[type[BaseException], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.BusyLoadingError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.OutOfMemoryError,
)


def script_text(name: str) -> str:
    """A script's source: the shared prelude, then the script."""
    package = resources.files("dedupe") / "lua"
    prelude = (package / "_prelude.lua").read_text(encoding="utf-8")
    return prelude + "\n" + (package / f"{name}.lua").read_text(encoding="utf-8")


@dataclass(frozen=True, slots=True)
class Lease:
    """A run's hold on its run key, as the heartbeat renews it."""

    key: str
    task_id: str
    token: str
    lease_ms: int
    #: The running record, to re-create the key if Redis lost it.
    record: bytes


class Store:
    """Every read and write celery-dedupe makes to Redis."""

    def __init__(self, client: redis.Redis, *, busy_poll: float = BUSY_POLL) -> None:
        self.client = client
        self._run = ScriptRunner(client, busy_poll)
        self._enqueue = self._register("enqueue")
        self._claim = self._register("claim")
        self._renew = self._register("renew")
        self._requeue = self._register("requeue")
        self._release = self._register("release")
        self._cancel = self._register("cancel")

    def _register(self, name: str) -> Script:
        return self.client.register_script(script_text(name))

    def enqueue(self, keys: CallKeys, record: bytes, ttl_ms: int) -> Holder | None:
        """Create the queued record of a call. None: accepted; a Holder: a duplicate of it."""
        with translated("enqueue"):
            reply = self._run(self._enqueue, [keys.record], [record, ttl_ms])
        return held_by(keys.record, reply)

    def claim(
        self,
        keys: CallKeys,
        task_id: str,
        token: str,
        lease_ms: int,
        host: str,
        pid: int,
        now: int,
    ) -> Holder | None:
        """Start a run. None: claimed; a Holder: another run is live on the key."""
        with translated("claim"):
            reply = self._run(
                self._claim,
                [keys.record, keys.run],
                [owner_of(task_id), token, lease_ms, host, pid, now],
            )
        return held_by(keys.run, reply)

    def renew(self, leases: Sequence[Lease]) -> list[int]:
        """Renew leases in one round trip: 1 renewed, 2 re-created, 0 lost (per lease)."""
        with translated("renew"):
            if len(leases) == 1:
                lease = leases[0]
                args = [owner_of(lease.task_id), lease.token, lease.lease_ms, lease.record]
                return [int(self._run(self._renew, [lease.key], args))]
            with self.client.pipeline(transaction=False) as pipe:
                for lease in leases:
                    self._renew_one(lease, pipe)
                return [int(code) for code in pipe.execute()]

    def _renew_one(self, lease: Lease, client: Any) -> Any:
        return self._renew(
            keys=[lease.key],
            args=[owner_of(lease.task_id), lease.token, lease.lease_ms, lease.record],
            client=client,
        )

    def requeue(self, keys: CallKeys, task_id: str, token: str, record: bytes, ttl_ms: int) -> int:
        """Put a continuing task id back to queued: 1 done, 0 or 2 left to its holder."""
        with translated("requeue"):
            return int(
                self._run(
                    self._requeue,
                    [keys.record, keys.run],
                    [owner_of(task_id), token, record, ttl_ms],
                )
            )

    def release(self, keys: CallKeys, task_id: str, token: str = "") -> int:
        """Delete what this task id (and run, when a token is given) holds; returns the count."""
        with translated("release"):
            return int(
                self._run(self._release, [keys.record, keys.run], [owner_of(task_id), token])
            )

    def release_soon(self, keys: CallKeys, task_id: str, token: str) -> None:
        """:meth:`release`, without waiting for the reply: the end of a run, whose worker
        goes on to its next task at once (the reply is read before that thread's next call)."""
        with translated("release"):
            self._run.send(self._release, [keys.record, keys.run], [owner_of(task_id), token])

    def cancel(self, keys: CallKeys, task_id: str) -> bool:
        """Delete this task id's record if it is still queued (never a running one)."""
        with translated("cancel"):
            return bool(self._run(self._cancel, [keys.record], [owner_of(task_id)]))

    def lookup(self, keys: CallKeys) -> Holder | None:
        """The holder of a call's keys: the queued record first, else the running one."""
        names = key_names(keys)
        with translated("lookup"), self.client.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.get(name)
                pipe.pttl(name)
            return first_holder(names, pipe.execute())

    def clear(self, keys: CallKeys) -> bool:
        """Delete a call's keys whoever holds them. True if anything was deleted."""
        with translated("clear"):
            names = {keys.record, keys.run}
            return bool(self.client.delete(*names))


def held_by(key: str, reply: int | bytes) -> Holder | None:
    """Read an enqueue or claim reply: None when granted (an integer), else who holds the
    key (``b"<pttl>:<record>"``)."""
    if isinstance(reply, int):
        return None
    pttl, _, raw = reply.partition(b":")
    return Holder.from_raw(key, raw, int(pttl))


def key_names(keys: CallKeys) -> list[str]:
    return [keys.record] if keys.run == keys.record else [keys.record, keys.run]


def first_holder(names: Sequence[str], replies: Sequence[Any]) -> Holder | None:
    """Read GET/PTTL pairs: the first key present, as a Holder."""
    for index, name in enumerate(names):
        raw = replies[2 * index]
        if raw is not None:
            return Holder.from_raw(name, raw, replies[2 * index + 1])
    return None


# Redis 6 reports a write refused inside a script as a script error carrying this text.
_OOM = "OOM command not allowed"


class translated:
    """Turn "Redis is unreachable" errors into :class:`RedisUnavailable`.

    A class, not a generator context manager: it wraps every round trip, and costs a
    fraction of one.
    """

    __slots__ = ("operation",)

    def __init__(self, operation: str) -> None:
        self.operation = operation

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is None:
            return
        if isinstance(exc, redis_errors) or (
            isinstance(exc, redis.ResponseError) and _OOM in str(exc)
        ):
            raise RedisUnavailable(self.operation, exc) from exc
